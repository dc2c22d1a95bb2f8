"""`python -m featurecache.training` (and `torchrun -m featurecache.training`): the train command."""

import sys

from featurecache.training.allocator import reexecute_with_tcmalloc

reexecute_with_tcmalloc()  # before torch is imported: TCMalloc where installed (training/allocator.py)

from featurecache.training.command import train_command  # noqa: E402

train_command(sys.argv[1:], prog_name="python -m featurecache.training")
