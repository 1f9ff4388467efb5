"""Process plumbing: the event loop, garbage-collector settings, listening sockets and
the embedded model server."""
