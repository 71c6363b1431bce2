"""The closed loop: measured step times correct the cost model and the ranks' speeds that the
next steps are planned with.

``timer`` (:class:`StepTimer`: micro-batch and gradient-sync times, CUDA events on GPU),
``feedback`` (:class:`Adaptive` on a process group, ``Piggyback`` riding the Rebalancer's
gather) and ``lagged`` (the lookahead sampler's lag rule). Importing this package loads
nothing.
"""
