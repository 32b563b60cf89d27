"""Helpers the entry points share: config schemas, instantiation, callbacks."""
