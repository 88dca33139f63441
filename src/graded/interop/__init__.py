"""Pretrained models as graded ones: Hugging Face GPT-2, LLaMA, BERT and Marian to ours and back.

:func:`from_gpt2` and :func:`from_llama` build a :class:`~graded.transformer.TransformerLM`
with the same architecture and weights as a Hugging Face ``GPT2LMHeadModel`` or
``LlamaForCausalLM`` (a model object, or a local checkpoint folder: nothing is downloaded), so
that both compute the same logits; :func:`to_gpt2` and :func:`to_llama` go back.
:func:`from_bert` builds the :class:`~graded.transformer.models.TransformerEncoder` of a
``BertModel`` (same hidden states) and :func:`to_bert` goes back; :func:`from_marian` builds the
:class:`~graded.transformer.Seq2SeqTransformer` of a ``MarianMTModel`` (same logits) and
:func:`to_marian` goes back.
:func:`graft_grading` then turns the model into an LGT or EGT (000 §5-6) whose grades start
neutral, so that fine-tuning with learnable grades starts from the pretrained function itself.

One module per reference model says how its weights map (:mod:`~graded.interop.gpt2`,
:mod:`~graded.interop.llama`, :mod:`~graded.interop.bert`, :mod:`~graded.interop.marian`);
:mod:`~graded.interop.grafting` holds :func:`graft_grading`, and
:mod:`~graded.interop._common` the loading and export checks they share.

A checkpoint folder must hold the architecture asked for (its ``config.json`` names the
``model_type``) and every weight of it: Hugging Face would otherwise initialise what is missing at
random and only log it. Going back, every architecture field of the :class:`TransformerConfig`
must be one the Hugging Face model has (GPT-2 has no ``embed_scale`` or ``logit_bias``, none has
unscaled scores, ...) and the attention exact; anything else is refused, naming the field,
rather than exported as a different function.

``transformers`` is needed only for these functions (a test dependency of the project).
"""

from graded.interop.bert import bert_config, from_bert, to_bert
from graded.interop.gpt2 import from_gpt2, gpt2_config, to_gpt2
from graded.interop.grafting import graft_grading
from graded.interop.llama import from_llama, llama_config, to_llama
from graded.interop.marian import (
    from_marian,
    marian_config,
    marian_generation_options,
    to_marian,
)

__all__ = ["bert_config", "from_bert", "from_gpt2", "from_llama", "from_marian", "gpt2_config",
           "graft_grading", "llama_config", "marian_config", "marian_generation_options",
           "to_bert", "to_gpt2", "to_llama", "to_marian"]
