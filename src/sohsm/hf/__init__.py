"""sohsm heads in Hugging Face causal language models (the ``hf`` extra: ``pip install 'sohsm[hf]'``).

::

    head = sohsm.hf.use_head(model, "self_organized", counts=counts)  # in place of model.lm_head
    head = sohsm.hf.use_head(model, "self_organized", counts=counts, data=batches)  # pretrained: fitted to lm_head
    head.attach(optimizer)                                           # or Trainer(..., callbacks=[HeadCallback()])
    model(input_ids, labels=input_ids).loss                          # the head's loss, labels shifted
    model.generate(input_ids)                                        # exact next-token log-probabilities
    model.save_pretrained(path); model = sohsm.hf.load(path)         # the head, its clusters and options

* :func:`use_head` (:mod:`sohsm.hf.head`): the head in place of ``lm_head``, tied where the config ties;
  :func:`head_of` finds it again;
* :mod:`sohsm.hf.pretrained`: what a two-level head keeps of a pretrained ``lm_head``, and the fit to it on the
  user's data (:mod:`sohsm.hf.fitting`, whose :class:`FitReport` says the gap reached);
* :class:`HeadCallback` (:mod:`sohsm.hf.callback`): attaches the head to the optimizer a ``Trainer`` builds;
* :func:`load` (:mod:`sohsm.hf.saving`): reads back what ``save_pretrained`` wrote.

``import sohsm`` imports none of this; ``import sohsm.hf`` checks that ``transformers`` is installed and imports
each name's module (and ``transformers`` with it: ``PreTrainedModel`` alone takes seconds) when the name is first
used, so a program that imports it and uses it on one path only pays on that path.
"""
import importlib.util

from sohsm.lazy import lazy_exports

if importlib.util.find_spec("transformers") is None:  # pragma: no cover - the extra is installed wherever tests run
    raise ImportError("sohsm.hf needs transformers: pip install 'sohsm[hf]'")

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "sohsm.hf.callback": ("HeadCallback",),
    "sohsm.hf.fitting": ("FitReport",),
    "sohsm.hf.head": ("LMHead", "head_of", "use_head"),
    "sohsm.hf.saving": ("load",),
})
