"""The feature record: every array's name, dtype, axes and meaning, in one place.

A record holds one target (a whole, uncropped biological assembly). Axis names:

- ``token``: N tokens. A standard residue or nucleotide is one token; each heavy atom of a
  ligand, ion or non-polymer is one token.
- ``atom``: A heavy atoms (hydrogens are dropped).
- ``msa``: M rows of the assembled MSA, the query first.
- ``template``: T template rows. Templates are per chain (AF-Multimer / AF3 layout): row t holds
  the t-th template of every chain in that chain's token columns (GAP / 0 elsewhere), and
  ``template_count`` says how many rows hold templates of each token's chain. A record stores
  up to FeatureConfig.max_templates_stored (20) per chain, so T is the largest count of any
  chain; the loader samples up to SampleConfig.max_templates (4) per chain from them.
- fixed sizes are written as integers.

The loader crops along ``token`` / ``atom`` and subsamples along ``msa`` using these axes, and
the tests check every record against this table.

Also here, because every layer that reads or writes records shares them: the store's table
names (TABLES) and the version numbers a record carries (SCHEMA_VERSION of the arrays,
RECORD_FORMAT of the codec's byte layout).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

SCHEMA_VERSION = 1  # the arrays and metadata described below (FEATURES, METADATA_FIELDS)
RECORD_FORMAT = 1  # byte layout of an encoded record (featurecache.store.codec)

# The store's tables. Every shard holds all of them; a key lives in the shard shard_of(key).
MSA_TABLE = "msa"  # per chain sequence (and per database searched): alignments and template hits
FEATURES_TABLE = "features"  # per target id: the feature record described by FEATURES
ERRORS_TABLE = "errors"  # per "<stage>/<key>": a failed unit of work, retried by the next run
TABLES = (MSA_TABLE, FEATURES_TABLE, ERRORS_TABLE)

# AF3's 32 residue classes: 20 amino acids + unknown, 4 RNA + unknown, 4 DNA + unknown, gap.
RESTYPES = (
    "ALA", "ARG", "ASN", "ASP", "CYS", "GLN", "GLU", "GLY", "HIS", "ILE",
    "LEU", "LYS", "MET", "PHE", "PRO", "SER", "THR", "TRP", "TYR", "VAL",
    "UNK",
    "A", "G", "C", "U", "N",
    "DA", "DG", "DC", "DT", "DN",
    "GAP",
)
NUM_RESTYPES = len(RESTYPES)  # 32
RESTYPE_INDEX = {name: i for i, name in enumerate(RESTYPES)}
UNK_PROTEIN = RESTYPE_INDEX["UNK"]
UNK_RNA = RESTYPE_INDEX["N"]
UNK_DNA = RESTYPE_INDEX["DN"]
GAP = RESTYPE_INDEX["GAP"]

# One-letter codes of the 20 standard amino acids, in RESTYPES order.
PROTEIN_LETTERS = "ARNDCQEGHILKMFPSTWYV"


@dataclass(frozen=True)
class ArraySpec:
    name: str
    dtype: np.dtype
    axes: tuple  # axis names (str) or fixed sizes (int)
    meaning: str


def _spec(name, dtype, axes, meaning):
    return ArraySpec(name, np.dtype(dtype), tuple(axes), meaning)


FEATURES: tuple[ArraySpec, ...] = (
    # --- token level -------------------------------------------------------------------
    _spec("restype", np.int8, ["token"], "AF3 residue class 0..31 (RESTYPES); ligand atoms are UNK"),
    _spec("residue_index", np.int32, ["token"], "residue number within its chain (label_seq_id, 1-based; ligands: 1)"),
    _spec("token_index", np.int32, ["token"], "0-based token number across the whole target"),
    _spec("asym_id", np.int32, ["token"], "chain number, 1-based, in mmCIF label_asym order"),
    _spec("entity_id", np.int32, ["token"], "entity number, 1-based; chains with the same sequence share it"),
    _spec("sym_id", np.int32, ["token"], "copy number of the chain within its entity, 1-based"),
    _spec("is_protein", np.bool_, ["token"], "token belongs to a protein chain"),
    _spec("is_rna", np.bool_, ["token"], "token belongs to an RNA chain"),
    _spec("is_dna", np.bool_, ["token"], "token belongs to a DNA chain"),
    _spec("is_ligand", np.bool_, ["token"], "token is a ligand / ion / non-polymer atom"),
    _spec("token_center_pos", np.float32, ["token", 3], "ground-truth centre atom (CA, C1', or the atom itself), Angstrom"),
    _spec("token_center_mask", np.bool_, ["token"], "centre atom resolved"),
    # --- atom level --------------------------------------------------------------------
    _spec("atom_to_token", np.int32, ["atom"], "token index of each atom"),
    _spec("atom_element", np.int8, ["atom"], "atomic number (0 = unknown element)"),
    _spec("atom_name_chars", np.uint8, ["atom", 4], "atom name as AF3 encodes it: ord(c) - 32 per character, padded"),
    _spec("atom_charge", np.int8, ["atom"], "formal charge"),
    _spec("atom_pos", np.float32, ["atom", 3], "ground-truth position, Angstrom"),
    _spec("atom_mask", np.bool_, ["atom"], "atom resolved in the structure (present with occupancy > 0)"),
    # --- MSA ---------------------------------------------------------------------------
    _spec("msa", np.int8, ["msa", "token"], "MSA class per position (RESTYPES index, GAP for gaps)"),
    _spec("deletion_matrix", np.uint8, ["msa", "token"], "number of deleted residues before each position (clipped at 255)"),
    _spec("msa_species", np.int32, ["msa"], "species id per row for pairing (0 = unknown / unpaired)"),
    _spec("msa_is_paired", np.bool_, ["msa"], "row was paired across chains by species"),
    _spec("msa_profile", np.float32, ["token", NUM_RESTYPES], "class distribution over all MSA rows"),
    _spec("deletion_mean", np.float32, ["token"], "mean deletion count over all MSA rows"),
    # --- templates ---------------------------------------------------------------------
    _spec("template_count", np.int16, ["token"], "template rows holding templates of this token's chain (rows 0..count-1, best hit first; 0 for non-protein chains)"),
    _spec("template_count", np.int16, ["token"], "template rows holding templates of this token's chain (rows 0..count-1, best hit first; 0 for non-protein chains)"),
    _spec("template_restype", np.int8, ["template", "token"], "template residue class aligned to the target (GAP where unaligned)"),
    _spec("template_backbone_pos", np.float32, ["template", "token", 3, 3], "template N, CA, C positions"),
    _spec("template_backbone_mask", np.bool_, ["template", "token", 3], "template N, CA, C present"),
    _spec("template_pseudo_beta_pos", np.float32, ["template", "token", 3], "template CB (CA for glycine) position"),
    _spec("template_pseudo_beta_mask", np.bool_, ["template", "token"], "template pseudo-beta present"),
)

FEATURES_BY_NAME = {spec.name: spec for spec in FEATURES}

# Metadata stored beside the arrays (msgpack map of plain values).
METADATA_FIELDS = {
    "id": "target id (file stem, lower case)",
    "resolution": "resolution in Angstrom, or None",
    "release_date": "ISO date string, or None",
    "method": "experimental method, e.g. 'X-RAY DIFFRACTION'",
    "chain_ids": "chain ids (label_asym_id) in asym_id order",
    "sequences": "one-letter (or CCD-code) sequence per chain, in asym_id order",
    "source_hash": "sha256 of the input file",
    "num_tokens": "N",
    "num_atoms": "A",
    "msa_depth": "M",
    "num_templates": "T: template rows stored, the most templates any chain holds (a sample uses up to SampleConfig.max_templates per chain)",
    "warnings": "list of warning strings (e.g. chain with no alignment)",
    "template_names": "templates stored, '<chain id>:<pdb id>_<chain>', in template row order per chain",
    "template_hits_without_coordinates": "template hits skipped because their structure was not available",
}


def check_record(arrays: dict, where: str = "record") -> None:
    """Raise ValueError naming the array if `arrays` does not match FEATURES."""
    sizes: dict = {}
    missing = [spec.name for spec in FEATURES if spec.name not in arrays]
    if missing:
        raise ValueError(f"{where}: missing arrays {missing}")
    for spec in FEATURES:
        value = arrays[spec.name]
        if value.dtype != spec.dtype:
            raise ValueError(f"{where}: {spec.name} has dtype {value.dtype}, expected {spec.dtype}")
        if value.ndim != len(spec.axes):
            raise ValueError(f"{where}: {spec.name} has shape {value.shape}, expected axes {spec.axes}")
        for axis, size in zip(spec.axes, value.shape):
            if isinstance(axis, int):
                if size != axis:
                    raise ValueError(f"{where}: {spec.name} has shape {value.shape}, expected axes {spec.axes}")
            elif sizes.setdefault(axis, size) != size:
                raise ValueError(
                    f"{where}: {spec.name} has {axis} size {size}, other arrays have {sizes[axis]}"
                )
