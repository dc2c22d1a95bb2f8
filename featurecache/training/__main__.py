"""`python -m featurecache.training` (and `torchrun -m featurecache.training`): the train command."""

import sys

from featurecache.training.command import train_command

train_command(sys.argv[1:], prog_name="python -m featurecache.training")
