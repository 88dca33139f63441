"""run_jobs_inline: every stage's jobs run in order, each stage planned from the earlier
stages' results, and the summary sees them all."""

from graded.study.core import Context, run_jobs_inline


class _TwoStages:
    name, title, claims, stages = "toy", "toy", (), 2

    def __init__(self):
        self.seen = []

    def plan(self, ctx, stage, previous):
        self.seen.append((stage, dict(previous)))
        if stage == 0:
            return [{"key": "a", "x": 2}, {"key": "b", "x": 3}]
        return [{"key": "sum", "x": previous["a"]["y"] + previous["b"]["y"]}]

    def run_job(self, ctx, job):
        return {"y": job["x"] * 10}

    def summarise(self, ctx, results):
        return sorted(results.items())


def test_jobs_run_stage_by_stage_with_the_earlier_results(tmp_path):
    exp = _TwoStages()
    out = run_jobs_inline(exp, Context(tmp_path, quick=True, seeds=1))
    # stage 0: a → 20, b → 30; stage 1 plans x = 50 → 500
    assert out == [("a", {"y": 20}), ("b", {"y": 30}), ("sum", {"y": 500})]
    assert exp.seen == [(0, {}), (1, {"a": {"y": 20}, "b": {"y": 30}})]
