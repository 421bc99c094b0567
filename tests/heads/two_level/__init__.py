"""Tests of the two-level heads: the layout and its kernels, fixed and self-organized clusters, the statistics
and re-clustering, device-side top-k and frequency bands."""
