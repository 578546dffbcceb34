"""Tabular diffusion (TabDDPM-Gaussian / TabDiff-mixed) shared by the workload and the attacks.

``model`` holds the schedules, the denoiser and the one pure loss; ``training`` the client
protocols; ``sampler`` the reverse process; ``preprocess`` the per-schema transforms; ``quality``
the synthetic-data report.
"""
