"""Eager execution: the interpreter between the functional layer and the VM."""
