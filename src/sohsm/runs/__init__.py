"""What is done with finished runs, apart from training them.

* :mod:`~sohsm.runs.report`: a run's summary and a table of runs over seeds.
* :mod:`~sohsm.runs.compare`: several heads trained side by side (``sohsm lm compare``).
* :mod:`~sohsm.runs.clusters`: a run's word clusters, listed and exported.
* :mod:`~sohsm.runs.plots`: the paper's Figure 1 for one run or several.
* :mod:`~sohsm.runs.results`: the results documents written from runs.
"""
