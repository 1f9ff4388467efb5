"""What the assistant does, for whom: the shopper's identity as the shop vouches for it
(``identity``), actions that wait for the shopper's yes (``confirmations``; the pure rules
are :mod:`chainrun.tools.confirm`) and clients' ``Idempotency-Key`` s (``request_keys``).

Import the modules themselves (nothing is re-exported here: ``identity`` is a leaf the
tools import, ``confirmations`` imports the tools).
"""
