"""Moving samples between data-parallel ranks at run time.

``rebalancer`` (:class:`Rebalancer`: gather every rank's sample descriptions, plan on every
rank, exchange with one ``all_to_all``) with its overlapped iteration (``overlap``), the
routing of samples (``routing``), the wire format (``wire``), its results (``results``:
:class:`RebalanceResult`, ``restore``) and the one thread its collectives run on (``worker``);
``window`` (:class:`WindowBalancer`, a streaming buffer planned without torch.distributed);
``caps`` (the over-cap check both share). Importing this package loads nothing: ``window`` and
``caps`` need numpy alone, the rest torch.
"""
