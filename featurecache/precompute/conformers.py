"""Reference conformers in the cache: computed once per CCD code, shared by every target.

Before featurizing, the driver asks each target which CCD codes its atoms come from
(`codes_of`, in the task tasks.conformer_codes), looks their keys (chem.conformer_key: code + CCD version + generator
settings) up in the ``conformers`` table, computes the missing ones once each, in batches on
Ray (`compute_conformers`), and writes them. Each featurize task then gets the stored records of
its target's codes (`conformers_for`), so no conformer is computed twice in a run or again in
a later run with the same CCD and settings. A code the CCD does not define has no conformer
(featurization keeps the model's atoms for it). A SMILES ligand (AF3 input JSON) is listed as
"smiles:<canonical SMILES>" and keyed by its canonical SMILES and the settings
(chem.conformer_key without a CCD), so every spelling of one molecule is computed once.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from featurecache.chem import (
    UnknownComponentError,
    component_conformer,
    conformer_from_arrays,
    conformer_key,
    smiles_conformer,
)
from featurecache.chem import conformer_to_arrays
from featurecache.chem.conformer_record import CONFORMER_FORMAT, settings_fingerprint
from featurecache.config import ChemConfig
from featurecache.features.conformers import ReferenceConformers, conformer_settings, needed_codes, smiles_of
from featurecache.io.structure import Structure
from featurecache.schema import CONFORMERS_TABLE
from featurecache.store.codec import decode_record, encode_record

BATCH_CODES = 16  # conformers per task: most take milliseconds, a Ray task costs about as much


@dataclass
class ComputedConformer:
    code: str
    key: str
    blob: bytes
    source: str  # chem.SOURCES
    fallback: str | None  # chem.FALLBACK_REASONS: why the positions are not RDKit's
    seconds: float


def codes_of(structure: Structure, chem: ChemConfig) -> list[str]:
    """The CCD codes featurizing `structure` uses, sorted."""
    return sorted(needed_codes(structure, ReferenceConformers(chem).ccd))


def keys_of(codes, chem: ChemConfig) -> dict[str, str]:
    """Code -> conformers-table key."""
    conformers = ReferenceConformers(chem)
    return {code: _key(code, conformers) for code in codes}


def _key(code: str, conformers: ReferenceConformers) -> str:
    smiles = smiles_of(code)
    if smiles is not None:
        return conformer_key(smiles, conformers.settings)
    return conformer_key(code, conformers.settings, ccd=conformers.ccd)


def compute_conformers(codes: list[str], chem: ChemConfig, zstd_level: int) -> list[ComputedConformer]:
    """Conformer records of `codes` (a task); codes the CCD does not define are skipped."""
    conformers = ReferenceConformers(chem)
    settings = conformer_settings(chem)
    done = []
    for code in codes:
        started = time.perf_counter()
        smiles = smiles_of(code)
        try:
            conformer = (
                smiles_conformer(smiles, settings)
                if smiles is not None
                else component_conformer(conformers.component(code), settings)
            )
        except UnknownComponentError:
            continue
        key = _key(code, conformers)
        arrays, meta = conformer_to_arrays(conformer)
        meta = {**meta, "ccd_version": conformers.ccd.version}
        blob = encode_record(key, arrays, meta, key.rsplit(":", 1)[1], "", CONFORMER_FORMAT, zstd_level)
        done.append(
            ComputedConformer(code, key, blob, conformer.source, conformer.fallback, time.perf_counter() - started)
        )
    return done


def conformers_for(conformer_blobs: dict[str, bytes] | None, chem: ChemConfig) -> ReferenceConformers:
    """The featurizer's conformers from stored records (code -> record bytes)."""
    given = {}
    for code, blob in (conformer_blobs or {}).items():
        record = decode_record(blob, where=f"{CONFORMERS_TABLE}/{code}")
        given[code] = conformer_from_arrays(record.arrays, record.meta)
    return ReferenceConformers(chem, given=given)


class ConformerStage:
    """The driver's conformer stage over one run (`run`: pipeline.PipelineRun, for its writer, runner,
    summary and failure records)."""

    def __init__(self, run, chem: ChemConfig) -> None:
        self.run = run
        self.chem = chem
        self.keys: dict[str, str] = {}  # code -> conformers-table key, of codes that have a record

    def prepare(self, todo, conformer_codes_task) -> dict[str, list[str]]:
        """Target id -> the codes whose stored records its featurize task gets; computes and
        writes every missing conformer once. `conformer_codes_task(target, chem)` lists a
        target's codes (a TaskError when it does not parse: featurize reports that)."""
        run, counts = self.run, self.run.summary.stages["conformers"]
        codes_by_target: dict[str, list[str]] = {}

        def listed(stage: str, target_id: str, result) -> None:
            if isinstance(result, list):
                codes_by_target[target_id] = result

        runner = run.runner(listed, lambda *_: None, len(todo), "components", "target")
        for target in todo:
            runner.submit("conformers", target.target_id, conformer_codes_task, target, self.chem)
        runner.drain()
        wanted = keys_of(sorted({code for codes in codes_by_target.values() for code in codes}), self.chem)
        missing = []
        for code, key in wanted.items():
            if not run.kept(CONFORMERS_TABLE, key):  # missing, or found damaged by --recheck
                missing.append(code)
            else:
                self.keys[code] = key
                counts.skipped += 1
        self._compute(missing)
        return {
            target_id: [code for code in codes if code in self.keys] for target_id, codes in codes_by_target.items()
        }

    def _compute(self, codes: list[str]) -> None:
        run, counts = self.run, self.run.summary.stages["conformers"]

        def computed(stage: str, batch: str, result) -> None:
            if not isinstance(result, list):  # a TaskError
                counts.failed += 1
                run.record_failure("conformers", batch, result.message)
                return
            with run.timed_write():
                for item in result:
                    run.put(
                        CONFORMERS_TABLE,
                        item.key,
                        item.blob,
                        index={"code": item.code, "source": item.source, "fallback": item.fallback},
                    )
                    self.keys[item.code] = item.key
            counts.done += len(result)
            run.summary.conformer_seconds += sum(item.seconds for item in result)

        def crashed(stage: str, batch: str, error: Exception) -> None:
            counts.failed += 1
            run.record_failure("conformers", batch, f"worker crashed: {type(error).__name__}: {error}")

        batches = [codes[start : start + BATCH_CODES] for start in range(0, len(codes), BATCH_CODES)]
        runner = run.runner(computed, crashed, len(batches), "conformers", "batch")
        for batch in batches:
            runner.submit(
                "conformers", ",".join(batch), compute_conformers, batch, self.chem, run.plan.feature_config.zstd_level
            )
        runner.drain()
        run.writer.flush()

    def blobs_for(self, codes: list[str]) -> dict[str, bytes]:
        """Code -> stored conformer record, for one featurize task."""
        return {code: self.run.writer.get(CONFORMERS_TABLE, self.keys[code]) for code in codes}


def chem_fingerprint(chem: ChemConfig) -> dict:
    """What of `chem` changes a feature record: the CCD's content (not its path) and the
    conformer settings as the conformers-table keys hash them (with the RDKit version)."""
    conformers = ReferenceConformers(chem)
    return {"ccd": conformers.ccd.version, "conformers": settings_fingerprint(conformers.settings)}
