"""Options that make every attention backend cover a sequence of ``T`` tokens exactly, shared
by the tests that run each backend by name: every pattern spans the whole sequence, the kernel
backends' denominator guard is negligible and the LSH backend hashes into one bucket."""

T = 8  # every sequence length of those tests
OPTIONS = {
    "full": {},
    "explicit": {},
    "chunked": {"query_chunk": 3, "key_chunk": 3},
    "sliding_window": {"window": T, "block_size": T},
    "dilated": {"dilation": 1},
    "sparse_fixed": {"block": T, "summary": 1},
    "block_sparse": {"layout": [[True, True], [True, True]], "block_size": T // 2},
    "bigbird": {"block_size": T // 2, "num_global_blocks": 1, "num_random_blocks": 1,
                "window_blocks": 3},
    "linear": {"eps": 1e-300},  # the denominator guard negligible: the formula exactly
    "performer": {"num_features": 6, "seed": 0, "eps": 1e-300},
    "linformer": {"max_len": T, "rank": T},
    "lsh": {"n_buckets": 1, "n_rounds": 1, "chunk_size": T},
}
