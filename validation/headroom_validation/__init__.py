"""Headroom's measurement harness: runs real PyTorch steps and records what they allocate.

See the Accuracy section of the repository's README.md; `validation/record` installs what it needs and runs it.
"""
