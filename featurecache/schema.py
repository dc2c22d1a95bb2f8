"""The feature record and the sample: every array's name, dtype, axes and meaning, in one place.

A record holds one target (a whole, uncropped biological assembly); a sample is what the loader
cuts from it for the model. FEATURES are the sample's arrays (what `collate` batches and the model
reads); RECORD_ARRAYS are the record's: FEATURES without the dense ``msa`` / ``deletion_matrix``,
plus MSA_STORAGE, the MSA stored once per entity, from which the loader assembles the rows a
sample draws (features.msa.expand_msa). Axis names:

- ``token``: N tokens. A standard residue or nucleotide is one token; each heavy atom of a
  ligand, ion, glycan or modified polymer residue is one token.
- ``atom``: A heavy atoms: every atom of every component from its CCD entry (hydrogens and the
  leaving atoms AF3 drops left out), resolved in the structure or not (``atom_mask``).
- ``token_bond``: B bonded token pairs (an edge list: far smaller than N x N).
- ``msa``: M rows of the assembled MSA, the query first.
- ``msa_entity``: E polymer entities with an alignment (homomer copies are one entity).
- ``msa_block_row`` / ``msa_block_column``: the stored rows of every entity's MSA (each row once,
  whatever number of assembled rows or chain copies show it) and their residue columns.
- ``msa_deletion``: the non-zero deletion counts of the stored rows.
- ``template``: T template rows. Templates are per chain (AF-Multimer / AF3 layout): row t holds
  the t-th template of every chain in that chain's token columns (GAP / 0 elsewhere), and
  ``template_count`` says how many rows hold templates of each token's chain. A record stores
  up to FeatureConfig.max_templates_stored (20) per chain, so T is the largest count of any
  chain; the loader samples up to SampleConfig.max_templates (4) per chain from them.
- fixed sizes are written as integers.

Arrays whose ``points_to`` names an axis hold indices into that axis (-1: none). The loader
crops along ``token`` / ``atom`` (remapping those indices into the crop: an index tuple whose
atom or token was cropped away becomes all -1, a ``token_bond`` row is dropped), subsamples
along ``msa``, and `collate` pads index arrays with -1; a model that wants AF3's dense
[N, N] token_bonds scatters the edge list after collate. The tests check every record
against this table.

Schema versions and migration: a record carries the SCHEMA_VERSION it was written with, and
every feature fingerprint includes it. Records of another version are never read as this one:
`featurecache precompute` on an older cache names them stale and recomputes them (MSA search
results, which the schema does not touch, are reused), and a trainer's CacheDataset refuses a
cache whose manifest has another schema_version, in one line saying to rerun precompute.
Version 2 added the AF3 atom inputs (ref_* reference-conformer features, atoms of every
component from the CCD, token bonds, representative-atom indices) and replaced atom_element /
atom_charge / atom_name_chars by ref_element / ref_charge / ref_atom_name_chars. Version 3 stores
the MSA once per entity (MSA_STORAGE) instead of the dense [msa, token] arrays, its
rows in small zstd frames (ROW_FRAMED) so a sample decodes only the frames holding its rows.
Version 4 (this one) adds the metadata `featurecache export` needs to write the input back for
other tools: modified residues (`modified_residues`), the covalent bonds to ligands
(`ligand_bonds`) and the templates' release dates (`template_release_dates`).

Also here, because every layer that reads or writes records shares them: the store's table
names (TABLES) and the version numbers a record carries (SCHEMA_VERSION of the arrays,
RECORD_FORMAT of the codec's byte layout).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

SCHEMA_VERSION = 4  # the arrays and metadata described below (RECORD_ARRAYS, FEATURES, METADATA_FIELDS)
RECORD_FORMAT = 1  # byte layout of an encoded record (featurecache.store.codec)

# The store's tables. Every shard holds all of them; a key lives in the shard shard_of(key).
MSA_TABLE = "msa"  # per chain sequence (and per database searched): alignments and template hits
FEATURES_TABLE = "features"  # per target id: the feature record described by FEATURES
ERRORS_TABLE = "errors"  # per "<stage>/<key>": a failed unit of work, retried by the next run
# per chem.conformer_key (CCD code + CCD version + generator settings): one reference conformer,
# computed once and shared by every target that uses the code (chem.CONFORMER_ARRAYS)
CONFORMERS_TABLE = "conformers"
TABLES = (MSA_TABLE, FEATURES_TABLE, ERRORS_TABLE, CONFORMERS_TABLE)

# AF3's 32 residue classes: 20 amino acids + unknown, 4 RNA + unknown, 4 DNA + unknown, gap.
RESTYPES = (
    "ALA",
    "ARG",
    "ASN",
    "ASP",
    "CYS",
    "GLN",
    "GLU",
    "GLY",
    "HIS",
    "ILE",
    "LEU",
    "LYS",
    "MET",
    "PHE",
    "PRO",
    "SER",
    "THR",
    "TRP",
    "TYR",
    "VAL",
    "UNK",
    "A",
    "G",
    "C",
    "U",
    "N",
    "DA",
    "DG",
    "DC",
    "DT",
    "DN",
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
    points_to: str | None = None  # the axis this array's values index (-1: none)


def _spec(name, dtype, axes, meaning, points_to=None):
    return ArraySpec(name, np.dtype(dtype), tuple(axes), meaning, points_to)


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
    _spec(
        "token_center_pos", np.float32, ["token", 3], "ground-truth centre atom (CA, C1', or the atom itself), Angstrom"
    ),
    _spec("token_center_mask", np.bool_, ["token"], "centre atom resolved"),
    _spec(
        "distogram_atom_index",
        np.int32,
        ["token"],
        "AF3's distogram / pseudo-beta atom: CB (CA for glycine), C4 of purines, C2 of pyrimidines, "
        "C1' of an unknown nucleotide, a per-atom token's own atom",
        "atom",
    ),
    _spec(
        "frame_atom_index",
        np.int32,
        ["token", 3],
        "frame atoms (a, b, c): N, CA, C; C1', C3', C4'; per-atom tokens: nearest, itself, second nearest "
        "atom of its residue in the reference conformer; -1 x 3 without a frame (AF3 4.3.2)",
        "atom",
    ),
    _spec(
        "token_bonds",
        np.int32,
        ["token_bond", 2],
        "bonded token pairs (i < j): polymer-ligand and ligand-ligand bonds (CCD bonds inside ligands and "
        "modified residues, _struct_conn covalent links with a ligand atom), none over 2.4 A (AF3 2.8)",
        "token",
    ),
    # --- atom level --------------------------------------------------------------------
    _spec("atom_to_token", np.int32, ["atom"], "token index of each atom", "token"),
    _spec("atom_pos", np.float32, ["atom", 3], "ground-truth position, Angstrom (0 where atom_mask is False)"),
    _spec("atom_mask", np.bool_, ["atom"], "atom resolved in the experiment (present with occupancy > 0)"),
    _spec(
        "ref_pos",
        np.float32,
        ["atom", 3],
        "reference conformer of the atom's component (RDKit, else CCD ideal / model coordinates), Angstrom",
    ),
    _spec(
        "ref_mask",
        np.bool_,
        ["atom"],
        "the atom has a reference position (AF3's 'atom slot used' is atom_pad_mask after collate: a record "
        "has no empty slots)",
    ),
    _spec("ref_element", np.int8, ["atom"], "atomic number from the CCD (0 = unknown element)"),
    _spec("ref_charge", np.int8, ["atom"], "formal charge from the CCD"),
    _spec(
        "ref_atom_name_chars", np.uint8, ["atom", 4], "atom name as AF3 encodes it: ord(c) - 32 per character, padded"
    ),
    _spec("ref_space_uid", np.int32, ["atom"], "reference space: one id per (chain, residue) instance, 0-based"),
    # --- MSA (msa and deletion_matrix: the sample's; the record stores MSA_STORAGE) -----------
    _spec("msa", np.int8, ["msa", "token"], "MSA class per position (RESTYPES index, GAP for gaps)"),
    _spec(
        "deletion_matrix",
        np.uint8,
        ["msa", "token"],
        "number of deleted residues before each position (clipped at 255)",
    ),
    _spec("msa_species", np.int32, ["msa"], "species id per row for pairing (0 = unknown / unpaired)"),
    _spec("msa_is_paired", np.bool_, ["msa"], "row was paired across chains by species"),
    _spec("msa_profile", np.float32, ["token", NUM_RESTYPES], "class distribution over all MSA rows"),
    _spec("deletion_mean", np.float32, ["token"], "mean deletion count over all MSA rows"),
    # --- templates ---------------------------------------------------------------------
    _spec(
        "template_count",
        np.int16,
        ["token"],
        "template rows holding templates of this token's chain (rows 0..count-1, best hit first; 0 for non-protein chains)",
    ),
    _spec(
        "template_restype",
        np.int8,
        ["template", "token"],
        "template residue class aligned to the target (GAP where unaligned)",
    ),
    _spec("template_backbone_pos", np.float32, ["template", "token", 3, 3], "template N, CA, C positions"),
    _spec("template_backbone_mask", np.bool_, ["template", "token", 3], "template N, CA, C present"),
    _spec("template_pseudo_beta_pos", np.float32, ["template", "token", 3], "template CB (CA for glycine) position"),
    _spec("template_pseudo_beta_mask", np.bool_, ["template", "token"], "template pseudo-beta present"),
)

FEATURES_BY_NAME = {spec.name: spec for spec in FEATURES}

# The sample's dense MSA arrays, which a record does not store: the loader assembles them for
# the rows a sample draws (and the tokens it keeps) from MSA_STORAGE.
DENSE_MSA = ("msa", "deletion_matrix")

# How a record stores the MSA: each entity's rows once (homomer copies and the paired rows that
# show a row share it), in that entity's residue columns; row r of the assembled MSA shows, in the
# token columns of every chain of entity e, stored row msa_row_source[r, e] (GAP / 0 where -1).
# Row 0, the query, is `restype` itself.
MSA_STORAGE: tuple[ArraySpec, ...] = (
    _spec(
        "msa_block",
        np.int8,
        ["msa_block_row", "msa_block_column"],
        "stored MSA rows of every entity (RESTYPES index), in its residue columns, GAP past its width",
    ),
    _spec("msa_block_deletion_count", np.int32, ["msa_block_row"], "non-zero deletion counts of each stored row"),
    _spec(
        "msa_block_deletion_column",
        np.int32,
        ["msa_deletion"],
        "column of each non-zero deletion count, stored rows in order",
        "msa_block_column",
    ),
    _spec("msa_block_deletion_value", np.uint8, ["msa_deletion"], "the non-zero deletion counts (clipped at 255)"),
    _spec(
        "msa_row_source",
        np.int32,
        ["msa", "msa_entity"],
        "stored row each assembled row shows in each entity's columns (-1: gaps; row 0 is the query)",
        "msa_block_row",
    ),
    _spec(
        "msa_token_entity",
        np.int32,
        ["token"],
        "the token's entity among msa_row_source's (-1: gaps but the query)",
        "msa_entity",
    ),
    _spec(
        "msa_token_column",
        np.int32,
        ["token"],
        "the token's residue column in its entity's stored rows",
        "msa_block_column",
    ),
)

# Arrays stored as independent zstd frames of this many rows (store.codec), so a reader decodes
# only the frames holding the rows it needs: 1,023 random rows of 15k touch a quarter of the
# 4-row frames, and 4-row frames cost ~20 % fewer bytes than 1-row ones (benchmarks/RESULTS.md).
ROW_FRAMED = {"msa_block": 4}

RECORD_ARRAYS: tuple[ArraySpec, ...] = tuple(spec for spec in FEATURES if spec.name not in DENSE_MSA) + MSA_STORAGE

# Every array a record or a sample may hold, by name (for code that indexes along the axes).
ARRAYS_BY_NAME = {spec.name: spec for spec in (*FEATURES, *MSA_STORAGE)}

# Sample arrays the loader computes after the crop from the record's own arrays: no record
# stores them, so adding one changes no SCHEMA_VERSION. `collate` batches them as FEATURES.
MAX_ATOM_PERMUTATIONS = 16  # symmetries kept per residue or ligand (fewest atoms moved first)
LOAD_TIME_FEATURES: tuple[ArraySpec, ...] = (
    _spec(
        "atom_permutations",
        np.int32,
        ["atom", MAX_ATOM_PERMUTATIONS],
        "the atom whose position each atom takes under its residue's k-th symmetric relabelling (AF3 SI 4.2: "
        "carboxylates, aromatic rings, a ligand's automorphisms; features.symmetry); -1 past its count",
        "atom",
    ),
    _spec(
        "msa_cycle_rows",
        np.int32,
        ["msa_cycle", "msa_cycle_row"],
        "the MSA rows (positions on the msa axis) recycling cycle c mod msa_cycle reads, AF3's fresh draw per "
        "cycle (SampleConfig.msa_cycle_draws x msa_rows_per_sample); -1 past a shallow MSA's depth",
        "msa",
    ),
)
SAMPLE_FEATURES = FEATURES + LOAD_TIME_FEATURES

# Metadata stored beside the arrays (msgpack map of plain values).
# The phrase every warning about an input file that ends mid-record carries (io writes it, stats
# counts the warnings that contain it).
CUT_SHORT = "file cut short"

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
    "conformer_codes": "CCD codes whose reference conformers ref_pos holds (keys of the conformers table)",
    "msa_depth": "M",
    "num_templates": "T: template rows stored, the most templates any chain holds (a sample uses up to SampleConfig.max_templates per chain)",
    "warnings": "list of warning strings (e.g. chain with no alignment; an input file cut short: contains CUT_SHORT)",
    "template_names": "templates stored, '<chain id>:<pdb id>_<chain>', in template row order per chain",
    "template_release_dates": "each stored template's release date (ISO, or None), in template_names' order",
    "template_hits_without_coordinates": "template hits skipped because their structure was not available",
    "modified_residues": "per chain, [1-based position, CCD code] of each polymer residue that is not the standard "
    "residue of its sequence letter (modified, non-standard); [] for ligand chains",
    "ligand_bonds": "the input's covalent bonds that token_bonds holds (each touches a ligand), as "
    "[[chain id, 0-based residue index, atom name], [...]] pairs",
}


def check_record(arrays: dict, where: str = "record", specs: tuple[ArraySpec, ...] = RECORD_ARRAYS) -> None:
    """Raise ValueError naming the array if `arrays` does not match `specs` (a record's arrays;
    give specs=FEATURES for a sample's)."""
    sizes: dict = {}
    missing = [spec.name for spec in specs if spec.name not in arrays]
    if missing:
        raise ValueError(f"{where}: missing arrays {missing}")
    for spec in specs:
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
                raise ValueError(f"{where}: {spec.name} has {axis} size {size}, other arrays have {sizes[axis]}")
