"""Old spelling of `python -m featurecache.training`, kept so existing launch scripts still run."""

import sys
import warnings

if __name__ == "__main__":
    warnings.warn(
        "`python -m featurecache.train` is deprecated: use `python -m featurecache.training`",
        DeprecationWarning,
        stacklevel=1,
    )
    print("featurecache: `-m featurecache.train` is deprecated, use `-m featurecache.training`", file=sys.stderr)
    from featurecache.training.command import train_command

    train_command(sys.argv[1:], prog_name="python -m featurecache.training")
