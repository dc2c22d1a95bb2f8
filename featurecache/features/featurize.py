"""Featurize one target: structure + per-chain MSAs + per-chain template hits -> one record.

`featurize_target` is what the ahead-of-time pipeline calls; `featurize_from_files` does the
whole online path (parse, find alignments, featurize) and is what training without a cache
would pay per example.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from featurecache.config import FeatureConfig, file_sha256
from featurecache import schema
from featurecache.features.conformers import ReferenceConformers
from featurecache.features.msa import build_msa_features
from featurecache.features.templates import TemplateReport, build_template_features
from featurecache.features.tokenize import input_warnings, tokenize
from featurecache.io.alignments import AlignmentIndex
from featurecache.io.hits import TemplateHit
from featurecache.io.mmcif import Structure, read_mmcif
from featurecache.io.msa import Msa

# Bump when featurization writes different arrays for the same inputs and settings without a
# schema change (1: MSA pairing takes every shared species' k-th rows, not one row per species).
# It is part of every feature record's fingerprint, so older records are recomputed, never reused.
FEATURIZE_REVISION = 1


def featurize_target(
    structure: Structure,
    chain_msas: dict[str, Msa | None],
    chain_template_hits: dict[str, list[TemplateHit]],
    config: FeatureConfig,
    template_dir: str | os.PathLike | None = None,
    *,
    source_hash: str | None = None,
    warnings: Sequence[str] = (),
    conformers: ReferenceConformers | None = None,
    given_templates: dict | None = None,
) -> tuple[dict[str, np.ndarray], dict]:
    """Arrays matching `schema.FEATURES` (checked) and metadata with `schema.METADATA_FIELDS`.

    chain_msas: {chain_id: Msa or None}; chains of one entity share the first MSA given for any
    of them. chain_template_hits: {chain_id: hits} with query indices in chain residue positions.
    source_hash: sha256 of the input file (None when the structure did not come from a file).
    conformers: the CCD and reference conformers to use (precompute passes the cached ones);
    None computes them here from the bundled CCD.
    given_templates: {chain_id: io.af3_json.GivenTemplate list}, an input's own templates, used
    instead of that chain's hits.
    """
    if not config.drop_hydrogens:
        raise ValueError(
            "FeatureConfig.drop_hydrogens=False is not supported: the record's atom axis holds heavy atoms only"
        )
    known = {chain.chain_id for chain in structure.chains}
    unknown = sorted((set(chain_msas) | set(chain_template_hits)) - known)
    if unknown:
        raise ValueError(
            f"{structure.source}: alignments given for chains {unknown}, the structure has {sorted(known)}"
        )
    notes = list(warnings) + input_warnings(structure)
    tokens = tokenize(structure, conformers)
    notes.extend(tokens.warnings)
    arrays = dict(tokens.arrays)
    arrays.update(build_msa_features(structure, tokens, chain_msas, config, notes))
    report = TemplateReport()
    arrays.update(
        build_template_features(structure, tokens, chain_template_hits, config, template_dir, report, given_templates)
    )
    notes.extend(report.warnings)
    schema.check_record(arrays, where=f"{structure.id} ({structure.source})")
    metadata = {
        "id": structure.id,
        "resolution": structure.resolution,
        "release_date": structure.release_date,
        "method": structure.method,
        "chain_ids": [chain.chain_id for chain in structure.chains],
        "sequences": [chain.sequence for chain in structure.chains],
        "source_hash": source_hash,
        "num_tokens": int(arrays["restype"].shape[0]),
        "num_atoms": int(arrays["atom_to_token"].shape[0]),
        "conformer_codes": sorted(tokens.conformer_codes),
        "msa_depth": int(arrays["msa_species"].shape[0]),
        "num_templates": int(arrays["template_restype"].shape[0]),
        "warnings": notes,
        "template_names": report.used,
        "template_release_dates": report.release_dates,
        "template_hits_without_coordinates": report.without_coordinates,
        "modified_residues": modified_residues(structure),
        "ligand_bonds": [
            [
                [bond.first.chain_id, bond.first.residue, bond.first.atom],
                [bond.second.chain_id, bond.second.residue, bond.second.atom],
            ]
            for bond in tokens.ligand_bonds
        ],
    }
    return arrays, metadata


def modified_residues(structure: Structure) -> list[list]:
    """Per chain, [1-based position, CCD code] of each polymer residue that is not the standard
    residue of its one-letter code (a modified or non-standard residue; its letter is its parent's,
    X / N for one without a parent), so the record keeps what its sequence letters do not say."""
    return [
        [
            [position, residue.name]
            for position, residue in enumerate(chain.residues, start=1)
            if residue.name != residue.parent
        ]
        if chain.is_polymer
        else []
        for chain in structure.chains
    ]


def featurize_from_files(
    mmcif_path: str | os.PathLike,
    alignments: AlignmentIndex | None,
    config: FeatureConfig,
    template_dir: str | os.PathLike | None = None,
) -> tuple[dict[str, np.ndarray], dict]:
    """Parse an mmCIF file, find its chains' alignments in `alignments` and featurize it."""
    structure = read_mmcif(mmcif_path)
    chain_msas: dict[str, Msa | None] = {}
    chain_hits: dict[str, list[TemplateHit]] = {}
    warnings: list[str] = []
    if alignments is not None:
        found, warnings = alignments.for_structure(structure)
        for chain_id, chain_alignments in found.items():
            chain_msas[chain_id] = chain_alignments.msa
            chain_hits[chain_id] = list(chain_alignments.hits)
    return featurize_target(
        structure,
        chain_msas,
        chain_hits,
        config,
        template_dir,
        source_hash=file_sha256(mmcif_path),
        warnings=warnings,
    )
