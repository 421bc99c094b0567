"""sohsm heads in Hugging Face causal language models (the ``hf`` extra: ``pip install 'sohsm[hf]'``).

::

    head = sohsm.hf.use_head(model, "self_organized", counts=counts)  # in place of model.lm_head
    head.attach(optimizer)                                           # or Trainer(..., callbacks=[HeadCallback()])
    model(input_ids, labels=input_ids).loss                          # the head's loss, labels shifted
    model.generate(input_ids)                                        # exact next-token log-probabilities
    model.save_pretrained(path); model = sohsm.hf.load(path)         # the head, its clusters and options

* :func:`use_head` (:mod:`sohsm.hf.head`): the head in place of ``lm_head``, tied where the config ties;
  :func:`head_of` finds it again;
* :class:`HeadCallback` (:mod:`sohsm.hf.callback`): attaches the head to the optimizer a ``Trainer`` builds;
* :func:`load` (:mod:`sohsm.hf.saving`): reads back what ``save_pretrained`` wrote.

``import sohsm`` imports none of this; ``import sohsm.hf`` imports ``transformers``.
"""
try:
    import transformers  # noqa: F401
except ImportError as error:  # pragma: no cover - the extra is installed wherever the tests run
    raise ImportError("sohsm.hf needs transformers: pip install 'sohsm[hf]'") from error

from sohsm.hf.callback import HeadCallback
from sohsm.hf.head import LMHead, head_of, use_head
from sohsm.hf.saving import load

__all__ = ["HeadCallback", "LMHead", "head_of", "load", "use_head"]
