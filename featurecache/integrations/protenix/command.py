"""`featurecache convert`: Protenix 2.x checkpoints to featurecache's and back (convert.py).

A file that is no checkpoint, a Protenix model the name map does not cover (unknown or missing
keys, named), or a featurecache model Protenix cannot hold is one line and exit 2, through
featurecache.errors.
"""

from __future__ import annotations

import pathlib

import click

from featurecache.errors import BoundaryCommand, UserError
from featurecache.integrations.protenix.convert import ConversionError, convert_from_protenix, convert_to_protenix


@click.command("convert", cls=BoundaryCommand)
@click.argument("source", type=click.Path(dir_okay=False, path_type=pathlib.Path))
@click.argument("dest", type=click.Path(dir_okay=False, path_type=pathlib.Path))
@click.option(
    "--to",
    "target",
    required=True,
    type=click.Choice(["featurecache", "protenix"]),
    help='featurecache: SOURCE is a Protenix 2.x checkpoint (its "model" state dict, e.g. the released '
    "protenix_base_default_v1.0.0.pt), DEST a featurecache checkpoint for `predict` and "
    "`train --init-from`; protenix: SOURCE is a featurecache checkpoint of a Protenix-dialect model "
    '(its EMA weights where it keeps them), DEST a {"model": state dict} file Protenix loads with '
    "strict=True.",
)
def convert_command(source: pathlib.Path, dest: pathlib.Path, target: str) -> None:
    """Convert a model checkpoint between Protenix and featurecache: SOURCE to DEST (written
    atomically; an existing DEST is replaced). Prints the converted model's sizes."""
    if dest.resolve() == source.resolve():
        raise UserError(f"{dest}: the same file as SOURCE; write the converted checkpoint elsewhere")
    if not dest.parent.is_dir():
        raise UserError(f"{dest}: folder {dest.parent} does not exist")
    try:
        convert = convert_from_protenix if target == "featurecache" else convert_to_protenix
        config = convert(source, dest)
    except ConversionError as error:
        raise UserError(str(error)) from error
    click.echo(
        f"{dest}: {target} checkpoint of a model with {config.trunk.pairformer_blocks} Pairformer blocks, "
        f"c_s {config.trunk.c_s}, c_z {config.trunk.c_z}, {config.diffusion.diffusion_blocks} diffusion blocks"
    )
