"""The MSA module and Pairformers split by rows over P ranks (DAP, docs/SHARDING.md): the sharded
blocks over the network's own parameters, and their collectives with autograd."""
