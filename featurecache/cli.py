"""Command line: thin click commands over the library.

Exit codes and the error boundary (one line per failure, tracebacks behind --debug) are in
featurecache/errors.py: 0 all done; 1 some inputs failed (the rest are cached); 2 usage or setup
error reported before any work starts; 130 interrupted (143: train stopped by SIGTERM; train
stops on either after a checkpoint).
"""

from __future__ import annotations

import json
import pathlib
import sys

import click

from featurecache.errors import DEBUG_FLAG, EXIT_PARTIAL, BoundaryGroup, UserError, renamed_option

# Formats matplotlib writes without extra backends.
PLOT_SUFFIXES = (".png", ".pdf", ".svg")


def _ray_options(command):
    """--address, --workers and --executor: where the tasks of precompute and search run."""
    options = [
        click.option(
            "--address",
            default=None,
            help="Ray cluster address to join (e.g. 'auto' or 'ray://host:10001'); default: start Ray locally.",
        ),
        click.option(
            "--workers",
            "num_workers",
            type=click.IntRange(min=1),
            default=None,
            help="CPUs Ray may use when started locally (default: all).",
        ),
        click.option(
            "--executor",
            type=click.Choice(["ray", "inline"]),
            default="ray",
            show_default=True,
            help="'inline' runs every task in this process, one at a time (debugging).",
        ),
    ]
    for option in reversed(options):  # click lists options in decorator order, top first
        command = option(command)
    return command


def _existing_cache(path: str) -> pathlib.Path:
    """The cache folder, generation or publish root at PATH, with its manifest read and checked."""
    from featurecache.store.manifest import read_manifest
    from featurecache.store.publish import resolve_generation

    if pathlib.Path(path).is_file():
        raise UserError(f"cache {path}: is a file, expected a cache folder")
    try:
        cache_dir = resolve_generation(pathlib.Path(path))
        read_manifest(cache_dir)
    except (OSError, ValueError, UnicodeError) as error:
        raise UserError(f"cache {path}: {error}") from error
    return cache_dir


def _utf8_file(option: str, path: pathlib.Path | None) -> pathlib.Path | None:
    """Refuse a text input that is missing, a folder, or not UTF-8, naming the option and file."""
    if path is None:
        return None
    try:
        path.read_bytes().decode("utf-8")
    except IsADirectoryError:
        raise UserError(f"{option} {path}: is a folder, expected a file") from None
    except OSError as error:
        raise UserError(f"{option} {path}: {error.strerror or error}") from None
    except UnicodeDecodeError as error:
        raise UserError(f"{option} {path}: not UTF-8 text ({error.reason} at byte {error.start})") from None
    return path


def _run_on_ray(run, options):
    """run(options) for precompute or search: a setup error is one line (exit 2), and Ray, if
    this process started it, is shut down however the run ends. Until Ray is down, stdout goes to
    stderr: Ray's error thread prints notices such as a lost node's ("(raylet) Raylet is
    terminated ...") on stdout, which carries only the command's result (--json)."""
    from contextlib import redirect_stdout

    from featurecache.precompute.plan import PipelineSetupError

    with redirect_stdout(sys.stderr):
        try:
            return run(options)
        except PipelineSetupError as error:
            raise UserError(str(error)) from error
        finally:
            _shutdown_ray()


def _shutdown_ray() -> None:
    """Stop the Ray this command started, here inside the error boundary: left to Ray's exit
    handler, a Ctrl-C during its shutdown printed a traceback and exited 0."""
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()


def _plot_path(
    path: pathlib.Path | None, option: str = "--plot", cache: pathlib.Path | None = None
) -> pathlib.Path | None:
    """Check a plot's file name before any work: a known image suffix in a folder that exists,
    outside the cache (`cache` or any other)."""
    from featurecache.store.layout import refuse_output_in_cache

    if path is None:
        return None
    refuse_output_in_cache(option, path, cache)
    if path.suffix.lower() not in PLOT_SUFFIXES:
        raise UserError(f"{option} {path}: use one of {', '.join(PLOT_SUFFIXES)}")
    if not path.parent.is_dir():
        problem = "is not a folder" if path.parent.exists() else "does not exist"
        raise UserError(f"{option} {path}: folder {path.parent} {problem}")
    if path.is_dir():
        raise UserError(f"{option} {path}: is a folder, expected a file name")
    return path


class _LazyGroup(BoundaryGroup):
    """Imports `train`, `predict`, `evaluate` and `convert` (torch and the model) only when one is run or its
    help is asked for, so the data commands start quickly."""

    lazy_commands = ("convert", "evaluate", "predict", "train")

    def list_commands(self, ctx):
        return sorted([*super().list_commands(ctx), *self.lazy_commands])

    def get_command(self, ctx, name):
        if name == "train":
            from featurecache.training.command import train_command

            return train_command
        if name == "predict":
            from featurecache.prediction.command import predict_command

            return predict_command
        if name == "evaluate":
            from featurecache.prediction.evaluate import evaluate_command

            return evaluate_command
        if name == "convert":
            from featurecache.integrations.protenix.command import convert_command

            return convert_command
        return super().get_command(ctx, name)


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="featurecache")
@click.option(DEBUG_FLAG, is_flag=True, help="Show Python tracebacks (may appear anywhere on the command line).")
def cli(debug):
    """featurecache: precompute AlphaFold3 features once, serve them to trainers fast."""


@cli.command()
@click.argument("inputs", nargs=-1, required=True, type=click.Path(path_type=pathlib.Path))
@click.option(
    "--cache",
    "cache_dir",
    required=True,
    type=click.Path(path_type=pathlib.Path),
    help="Cache folder to create or update (LMDB shards + manifest.json).",
)
@click.option(
    "--config",
    "config_path",
    type=click.Path(path_type=pathlib.Path),
    help="Pipeline TOML (examples/pipeline.toml): search databases and tools; feature, curation, "
    "clustering, chemistry, template and store settings. With --alignments its settings apply and "
    "it may configure no [[databases]].",
)
@click.option(
    "--alignments",
    "alignments_dir",
    type=click.Path(path_type=pathlib.Path),
    help="Folder of precomputed alignments (A3M/A2M/Stockholm/HHR/m8) to ingest.",
)
@click.option(
    "--templates",
    "template_dir",
    type=click.Path(path_type=pathlib.Path),
    help="Folder of template mmCIF files for template hits (overrides the config's).",
)
@_ray_options
@click.option(
    "--shards",
    "num_shards",
    type=click.IntRange(min=1),
    default=None,
    help="Number of LMDB shard files for a new cache (default 4; an existing cache keeps its own).",
)
@click.option(
    "--msa-rows-stored",
    type=click.IntRange(min=1),
    default=None,
    help="Rows stored in each target's assembled MSA, query included "
    "(default: the config's features.msa_rows_stored, else 16384).",
)
@click.option(
    "--max-msa-rows",
    type=click.IntRange(min=1),
    default=None,
    hidden=True,
    callback=renamed_option("--max-msa-rows", "--msa-rows-stored (MSA rows stored per target)"),
    help="Deprecated spelling of --msa-rows-stored.",
)
@click.option(
    "--ccd",
    "ccd_path",
    type=click.Path(path_type=pathlib.Path),
    default=None,
    help="A newer components.cif[.gz] from wwPDB for component atoms, bonds and conformers "
    "(default: the config's [chem] ccd_path, else the CCD biotite ships).",
)
@click.option(
    "--retry-failed/--no-retry-failed",
    default=True,
    show_default=True,
    help="Retry inputs that failed in an earlier run.",
)
@click.option(
    "--recheck",
    is_flag=True,
    help="Also read every record the run would keep in full (the checksum of every byte, as verify "
    "does) and recompute the damaged ones: the repair `featurecache verify` suggests. Reads the "
    "whole cache.",
)
@click.option("--progress/--no-progress", default=True, show_default=True, help="Show a progress bar.")
@click.option("--verbose", is_flag=True, help="Show Ray's own messages: start-up, warnings, what its workers print.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def precompute(
    inputs,
    cache_dir,
    config_path,
    alignments_dir,
    template_dir,
    address,
    num_workers,
    executor,
    num_shards,
    msa_rows_stored,
    max_msa_rows,
    ccd_path,
    retry_failed,
    recheck,
    progress,
    verbose,
    as_json,
):
    """Parse INPUTS (mmCIF, PDB, FASTA or AlphaFold3 input JSON files, or folders of them), search
    or ingest alignments, compute reference conformers, featurize, and write the records into the
    cache. Resumable: current records are skipped (--recheck: unless damaged)."""
    from featurecache.precompute.pipeline import PrecomputeOptions, precompute as run

    _utf8_file("--config", config_path)
    options = PrecomputeOptions(
        inputs=list(inputs),
        cache_dir=cache_dir,
        config_path=config_path,
        alignments_dir=alignments_dir,
        template_dir=template_dir,
        address=address,
        num_workers=num_workers,
        executor=executor,
        num_shards=num_shards,
        msa_rows_stored=max_msa_rows if msa_rows_stored is None else msa_rows_stored,
        ccd_path=ccd_path,
        retry_failed=retry_failed,
        recheck=recheck,
        progress=progress,
        verbose=verbose,
    )
    summary = _run_on_ray(run, options)
    if as_json:
        click.echo(json.dumps(summary.to_dict(), indent=2))
    else:
        click.echo(summary.format())
    sys.exit(EXIT_PARTIAL if summary.failed else 0)


@cli.command()
@click.argument("inputs", nargs=-1, required=True, type=click.Path(path_type=pathlib.Path))
@click.option(
    "--config",
    "config_path",
    required=True,
    type=click.Path(path_type=pathlib.Path),
    help="Pipeline TOML naming the search tools and databases (as for precompute).",
)
@click.option(
    "--out",
    "out_dir",
    required=True,
    type=click.Path(path_type=pathlib.Path),
    help="Folder for the AlphaFold3 JSON (af3/), A3M files and template hits (msas/) and index.json.",
)
@click.option(
    "--cache",
    "cache_dir",
    type=click.Path(path_type=pathlib.Path),
    default=None,
    help="Cache whose msa table stores the searches, so a later precompute --cache reuses them (default: OUT/cache).",
)
@click.option(
    "--max-templates",
    type=click.IntRange(min=0),
    default=4,
    show_default=True,
    help="Templates per protein chain in the AlphaFold3 JSON (AF3 uses 4).",
)
@_ray_options
@click.option("--progress/--no-progress", default=True, show_default=True, help="Show a progress bar.")
@click.option("--verbose", is_flag=True, help="Show Ray's own messages: start-up, warnings, what its workers print.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def search(
    inputs, config_path, out_dir, cache_dir, max_templates, address, num_workers, executor, progress, verbose, as_json
):
    """Run only the configured MSA and template searches for INPUTS (mmCIF, PDB, FASTA or AlphaFold3
    JSON files, or folders of them) and write, per unique chain, A3M files and template hits,
    and per target an AlphaFold3 input JSON with its MSAs and templates filled in."""
    from featurecache.precompute.search_command import SearchOptions, search as run
    from featurecache.store.layout import refuse_output_in_cache

    refuse_output_in_cache("--out", out_dir, cache_dir)
    _utf8_file("--config", config_path)
    options = SearchOptions(
        inputs=list(inputs),
        config_path=config_path,
        out_dir=out_dir,
        cache_dir=cache_dir,
        address=address,
        executor=executor,
        num_workers=num_workers,
        max_templates=max_templates,
        progress=progress,
        verbose=verbose,
    )
    summary = _run_on_ray(run, options)
    click.echo(json.dumps(summary.to_dict(), indent=2) if as_json else summary.format())
    sys.exit(EXIT_PARTIAL if summary.failed else 0)


@cli.command()
@click.argument("cache_dir", type=click.Path(path_type=pathlib.Path))
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
@click.option(
    "--plot",
    "plot_path",
    type=click.Path(path_type=pathlib.Path),
    help="Also draw the report (.png, .pdf or .svg): lengths, MSA depths, templates, failures, "
    "conformer sources, curation and the AF3 sampling.",
)
def stats(cache_dir, as_json, plot_path):
    """Counts, sizes, length and MSA-depth distributions, warnings and failures by stage."""
    from featurecache.store.inspect import cache_stats, format_stats
    from featurecache.store.plot import plot_stats

    _plot_path(plot_path, cache=cache_dir)
    report = cache_stats(_existing_cache(cache_dir))
    click.echo(json.dumps(report, indent=2) if as_json else format_stats(report))
    if plot_path:
        plot_stats(report, plot_path)
        if not as_json:
            click.echo(f"plot written to {plot_path}")


@cli.command()
@click.argument("run_dir", type=click.Path(path_type=pathlib.Path))
@click.option(
    "--out",
    "out_path",
    type=click.Path(path_type=pathlib.Path),
    help="Image to write (.png, .pdf or .svg)  [default: RUN_DIR/training.png]",
)
def plot(run_dir, out_path):
    """Draw a training run's log (RUN_DIR/log.jsonl): loss and its terms, validation lDDT, step time,
    peak memory, gradient norm and learning rate."""
    from featurecache.training.run_plot import DEFAULT_PLOT, RunLogError, plot_run

    if not run_dir.is_dir():
        problem = "is a file, expected a folder" if run_dir.exists() else "no such folder"
        raise UserError(f"{run_dir}: {problem} (give the --out folder of a `featurecache train` run)")
    out_path = _plot_path(out_path or run_dir / DEFAULT_PLOT, "--out")
    try:
        plot_run(run_dir, out_path)
    except RunLogError as error:
        raise UserError(str(error)) from error
    click.echo(f"plot written to {out_path}")


@cli.command()
@click.argument("cache_dir", type=click.Path(path_type=pathlib.Path))
@click.option(
    "--repair",
    is_flag=True,
    help="Also repair the shard files: rewrite each one that differs from the manifest while its records "
    "are intact (damage in free space), move each unreadable one aside for an empty one; then verify "
    "again. Damaged records are left to `precompute --recheck`.",
)
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
def verify(cache_dir, repair, as_json):
    """Recompute every record's checksum; name each damaged key and shard (exit 1 if any) and the
    command that repairs them."""
    from featurecache.store.locks import StoreLockedError
    from featurecache.store.repair import repair_cache
    from featurecache.store.verify import verify_cache

    cache = _existing_cache(cache_dir)
    if not repair:
        report = verify_cache(cache)
        click.echo(json.dumps(report.to_dict(), indent=2) if as_json else report.format())
        sys.exit(0 if report.ok else EXIT_PARTIAL)
    try:
        repaired = repair_cache(cache)
    except StoreLockedError as error:
        raise UserError(f"cannot repair {cache}: {error}") from error
    click.echo(json.dumps(repaired.to_dict(), indent=2) if as_json else repaired.format())
    sys.exit(0 if repaired.after.ok else EXIT_PARTIAL)


@cli.command()
@click.argument("cache_dir", type=click.Path(path_type=pathlib.Path))
@click.argument("key")
@click.option(
    "--table",
    default="features",
    show_default=True,
    type=click.Choice(["features", "msa", "errors", "conformers"]),
    help="Table to read the key from.",
)
def show(cache_dir, key, table):
    """One record's arrays: names, dtypes, shapes and summary values."""
    from featurecache.store.inspect import format_record

    try:
        click.echo(format_record(_existing_cache(cache_dir), table, key))
    except KeyError as error:
        raise UserError(str(error.args[0])) from error


@cli.command()
@click.argument("cache_dir", type=click.Path(path_type=pathlib.Path))
@click.argument("keys", nargs=-1, required=True)
@click.option(
    "--format",
    "output_format",
    required=True,
    type=click.Choice(["af3-json", "protenix-json", "boltz-yaml", "a3m", "boltz-csv"]),
    help="af3-json: one AlphaFold3 input JSON per key (MSAs, templates); protenix-json: one Protenix "
    "input JSON per key and its MSA files; boltz-yaml: one Boltz input YAML per key and its MSA "
    "CSVs; a3m: one A3M per chain; boltz-csv: one Boltz MSA CSV per protein chain (key, "
    "sequence; paired rows share a key).",
)
@click.option(
    "--out",
    "out_dir",
    required=True,
    type=click.Path(path_type=pathlib.Path),
    help="Folder to write into (KEY.json, KEY.protenix.json, KEY.yaml; MSA files under KEY/).",
)
def export(cache_dir, keys, output_format, out_dir):
    """Write the cached feature records of KEYS (target ids) as input files of AlphaFold3 (JSON), Protenix
    (JSON) or Boltz (YAML), or as A3M files or Boltz MSA CSV files."""
    from featurecache.export import ExportError, export_records
    from featurecache.store.layout import refuse_output_in_cache

    refuse_output_in_cache("--out", out_dir, cache_dir)
    warnings: list[str] = []
    try:
        written = export_records(_existing_cache(cache_dir), list(keys), output_format, out_dir, warnings)
    except ExportError as error:
        raise UserError(str(error)) from error
    except OSError as error:
        raise UserError(f"--out {out_dir}: {error.strerror or error}") from error
    for warning in warnings:
        click.echo(f"warning: {warning}", err=True)
    click.echo(f"{len(written)} file(s) written to {out_dir}")


@cli.command()
@click.argument("cache_dir", type=click.Path(path_type=pathlib.Path))
@click.argument("dest", type=click.Path(path_type=pathlib.Path))
def publish(cache_dir, dest):
    """Seal a finished cache into a new immutable generation under DEST (shared storage)."""
    from featurecache.store.publish import publish as run_publish

    generation = run_publish(_existing_cache(cache_dir), dest)
    click.echo(f"published {cache_dir} as {generation}")


@cli.command()
@click.argument("dest", type=click.Path(path_type=pathlib.Path))
@click.option("--keep", type=click.IntRange(min=1), default=2, show_default=True, help="Newest generations to keep.")
def gc(dest, keep):
    """Remove old generations under DEST, keeping the newest KEEP (never the one LATEST names)."""
    from featurecache.store.publish import gc as run_gc

    removed = run_gc(dest, keep=keep)
    for path in removed:
        click.echo(f"removed {path}")
    click.echo(f"{len(removed)} generation(s) removed")


def main():
    from featurecache.training.allocator import reexecute_with_tcmalloc, runs_the_model

    if runs_the_model(sys.argv[1:]):
        reexecute_with_tcmalloc()  # the model's commands on TCMalloc where installed (training/allocator.py)
    cli(prog_name="featurecache")


if __name__ == "__main__":
    main()
