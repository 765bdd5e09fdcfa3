"""Headroom's measurement harness: runs real PyTorch steps and records what they allocate.

See validation/README.md. `validation/record` installs what it needs and runs it.
"""
