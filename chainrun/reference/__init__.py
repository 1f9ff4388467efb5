"""The reference pages of the docs as data read from the code: the configuration keys
and the log's columns (:mod:`chainrun.reference.pages`)."""
