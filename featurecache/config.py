"""Configuration dataclasses and stable fingerprints.

A fingerprint is a short hash of everything that changes a result. Records store the
fingerprint they were computed with; a rerun recomputes records whose fingerprint differs.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import numbers
from dataclasses import dataclass


def stable_hash(value) -> str:
    """sha256 hex digest of a JSON-able value (dataclasses allowed), independent of dict order."""
    if dataclasses.is_dataclass(value):
        value = dataclasses.asdict(value)
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def fingerprint(*parts) -> str:
    """Short stable fingerprint (16 hex characters) of several JSON-able parts."""
    return stable_hash(list(parts))[:16]


def file_sha256(path, chunk_size: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(chunk_size), b""):
            digest.update(chunk)
    return digest.hexdigest()


# Feature settings renamed since caches were first written: old name -> new name. The pipeline
# TOML still reads the old name (with a warning), and fingerprints hash the old name, so that a
# rename leaves every existing record current.
FEATURE_RENAMES = {
    "max_msa_rows": "msa_rows_stored",
    "max_templates": "max_templates_stored",
    "template_max_release_gap_days": "template_release_gap_days",
}


@dataclass(frozen=True)
class FeatureConfig:
    """Settings that change a feature record; all of them go into its fingerprint."""

    msa_rows_stored: int = 16384  # rows of each target's assembled MSA stored (query included)
    max_paired_rows: int = 8192  # rows paired by species across chains
    # Templates (AF3 SI 2.4): up to 20 hits per chain pass the filters and are stored; the loader
    # draws up to SampleConfig.max_templates of them per sample.
    max_templates_stored: int = 20  # filtered template hits stored per chain (was max_templates)
    max_template_hits: int = 100  # hits examined per chain, in file order (bounds template files read)
    template_release_gap_days: int = 60  # AF3: template released at least this long before the target
    min_template_align_ratio: float = 0.1  # AlphaFold: hit must cover > 10 % of the query
    max_template_subsequence_ratio: float = 0.95  # AlphaFold: drop near-identical subsequences
    min_template_hit_length: int = 10  # AF3: drop hits of fewer template residues
    deduplicate_templates: bool = True  # AF3: of hits placing the same residues on the query, keep the first
    drop_hydrogens: bool = True
    zstd_level: int = 3  # 0 disables compression

    def __post_init__(self) -> None:
        for name in (
            "max_templates_stored",
            "max_template_hits",
            "template_release_gap_days",
            "min_template_hit_length",
        ):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")

    def fingerprint_fields(self) -> dict:
        """The settings as fingerprints hash them: renamed ones under their old names."""
        old_names = {new: old for old, new in FEATURE_RENAMES.items()}
        return {old_names.get(name, name): value for name, value in dataclasses.asdict(self).items()}

    def config_fingerprint(self) -> str:
        """Fingerprint of these settings alone (the manifest's "feature_config").

        It hashes the settings' text as FeatureConfig's repr wrote it before the renames, which
        is what caches written before them hold.
        """
        settings = ", ".join(f"{name}={value!r}" for name, value in self.fingerprint_fields().items())
        return fingerprint(f"FeatureConfig({settings})")


CONFORMER_FORCE_FIELDS = ("mmff", "none")


@dataclass(frozen=True)
class ChemConfig:
    """The chemistry a record's atoms and reference conformers come from (the ``[chem]`` table).

    All of it goes into feature fingerprints, the CCD by its content (chem.Ccd.version), not by
    its path; the conformer settings also key the ``conformers`` table (chem.conformer_key).
    """

    ccd_path: str | None = None  # a newer components.cif[.gz] from wwPDB; None: biotite's bundled CCD
    conformer_seed: int = 0  # RDKit ETKDGv3 random seed
    conformer_timeout_s: int = 10  # ETKDG gives up after this many seconds (then CCD coordinates); 0: never
    conformer_max_iterations: int = 0  # ETKDG embedding attempts; 0: RDKit's default
    conformer_force_field: str = "mmff"  # "mmff": relax the ETKDG conformer with MMFF94; "none": AF3's exact recipe
    # Angstrom: an RDKit conformer with a bond this much longer or shorter than in the CCD's
    # ideal (else model) coordinates takes those coordinates instead (metal complexes); inf: never
    conformer_max_bond_deviation: float = 0.2

    def __post_init__(self) -> None:
        if self.conformer_force_field not in CONFORMER_FORCE_FIELDS:
            raise ValueError(
                f"conformer_force_field must be one of {CONFORMER_FORCE_FIELDS}, got {self.conformer_force_field!r}"
            )
        for name in ("conformer_seed", "conformer_timeout_s", "conformer_max_iterations"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
        deviation = self.conformer_max_bond_deviation
        if isinstance(deviation, bool) or not isinstance(deviation, numbers.Real) or not deviation > 0:
            raise ValueError(
                f"conformer_max_bond_deviation must be a number > 0 (Angstrom; inf: no check), got {deviation!r}"
            )


# AF3 SI Table 9: crystallization aids, removed from structures solved by crystallography.
CRYSTALLIZATION_AIDS = (
    "SO4",
    "GOL",
    "EDO",
    "PO4",
    "ACT",
    "PEG",
    "DMS",
    "TRS",
    "PGE",
    "PG4",
    "FMT",
    "EPE",
    "MPD",
    "MES",
    "CD",
    "IOD",
)


@dataclass(frozen=True)
class CurationConfig:
    """What precompute removes from a parsed structure before featurizing it (AF3 SI 2.5.4).

    Defaults are AlphaFold 3's. Every setting changes feature records, so all of them go into
    the feature fingerprint. A target that fails a target filter gets no feature record; what
    a bioassembly filter removes is listed in the record's metadata ("curation"). AF3's other
    removals happen elsewhere: hydrogens and waters in the parser (io.mmcif), model atoms the
    CCD does not list and leaving atoms in featurization (features.atoms).
    """

    max_resolution: float = 9.0  # Angstrom; worse structures are left out (inf: keep all)
    min_release_date: str | None = None  # ISO date; structures released earlier are left out
    max_release_date: str | None = None  # ISO date; later ones are left out (AF3 trained up to 2021-09-30)
    max_polymer_chains: int = 300  # structures with more polymer chains are left out (AF3 training)
    min_resolved_residues: int = 4  # polymer chains with fewer resolved residues are removed
    remove_unknown_polymers: bool = True  # polymer chains of unknown residues only are removed
    clash_distance: float = 1.7  # Angstrom; a chain with more than clash_fraction of its atoms
    clash_fraction: float = 0.3  # this close to another chain's atoms clashes (1.0: no clash filter)
    max_ca_gap: float = 10.0  # Angstrom; protein chains with consecutive CA atoms further apart are removed
    crystallization_aids: tuple[str, ...] = CRYSTALLIZATION_AIDS  # ligands removed from crystal structures
    max_chains: int = 20  # larger assemblies keep the 20 chains nearest a random interface token
    interface_distance: float = 5.0  # Angstrom; chains with heavy atoms closer than this form an interface
    seed: int = 0  # the chain-subset draw is seeded by (seed, target id)

    def __post_init__(self) -> None:
        for name in ("max_resolution", "clash_distance", "max_ca_gap", "interface_distance"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if not 0.0 <= self.clash_fraction <= 1.0:
            raise ValueError(f"clash_fraction must be in [0, 1], got {self.clash_fraction}")
        for name in ("max_polymer_chains", "max_chains"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.min_resolved_residues < 0:
            raise ValueError(f"min_resolved_residues must be >= 0, got {self.min_resolved_residues}")
        for name in ("min_release_date", "max_release_date"):
            value = getattr(self, name)
            if value is not None and not _is_iso_date(value):
                raise ValueError(f"{name} must be an ISO date (YYYY-MM-DD), got {value!r}")


def _is_iso_date(value) -> bool:
    try:
        return isinstance(value, str) and datetime.date.fromisoformat(value).isoformat() == value
    except ValueError:
        return False


@dataclass(frozen=True)
class ClusteringConfig:
    """How precompute clusters chains and interfaces and weighs them for sampling (AF3 SI 2.5.1,
    2.5.3, eq. 1). Nothing here changes a feature record: clusters and weights live in the manifest.
    """

    enabled: bool = True
    protein_min_seq_id: float = 0.4  # MMseqs2 easy-cluster --min-seq-id for protein chains
    nucleic_min_seq_id: float = 1.0  # ... for DNA and for RNA chains (clustered apart)
    min_coverage: float = 0.8  # MMseqs2 -c (of both sequences, its default coverage mode)
    min_protein_length: int = 10  # shorter protein chains (peptides) cluster by identical sequence
    min_nucleic_length: int = 20  # shorter DNA / RNA chains cluster by identical sequence
    # AF3 eq. 1: w = beta / N_clust * (alpha_prot n_prot + alpha_nuc n_nuc + alpha_ligand n_ligand)
    alpha_protein: float = 3.0
    alpha_nucleic: float = 3.0
    alpha_ligand: float = 1.0
    beta_chain: float = 0.5
    beta_interface: float = 1.0

    def __post_init__(self) -> None:
        for name in ("protein_min_seq_id", "nucleic_min_seq_id", "min_coverage"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {getattr(self, name)}")
        for name in ("min_protein_length", "min_nucleic_length"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("alpha_protein", "alpha_nucleic", "alpha_ligand", "beta_chain", "beta_interface"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")


@dataclass(frozen=True)
class StoreConfig:
    num_shards: int = 4
    map_size_bytes: int = 1 << 28  # initial LMDB map size per shard; grows when full
    batch_records: int = 64  # records per write transaction


# AF3's crop modes (SI 2.7), in the order of SampleConfig.crop_mode_probs.
CROP_MODES = ("contiguous", "spatial", "spatial_interface")


@dataclass(frozen=True)
class SampleConfig:
    """How one training sample is cut from a whole feature record, every epoch anew.

    Shared by CacheDataset, OnlineDataset, TrainConfig and `featurecache train`, so each setting
    has one name and one default. Unlike FeatureConfig, nothing here changes what is stored.
    """

    crop_size: int | None = 384  # tokens per sample (AF3's initial training crop); None: whole targets
    msa_rows_per_sample: int = 1024  # MSA rows the model sees per recycling cycle, query first
    # AF3 (SI 2.2, its code's per-cycle shuffle and truncation to 1024 rows) draws the MSA rows anew
    # in every recycling cycle. The loader draws this many independent row sets per sample (a
    # pool of their union and each set's positions in it, `msa_cycle_rows`); cycle i of the model
    # uses set i mod msa_cycle_draws. AF3 trains with up to 4 cycles: 4. 1: one set for every cycle.
    msa_cycle_draws: int = 4
    # Chance of each crop mode, in CROP_MODES order (AF3 SI 2.7: contiguous 0.2, spatial 0.4,
    # spatial interface 0.4); the spatial ones centre on the sampled chain or interface.
    crop_mode_probs: tuple[float, float, float] = (0.2, 0.4, 0.4)
    max_templates: int | None = 4  # templates per chain and sample (AF3: 4); None: every stored one
    random_templates: bool = True  # AF3 training: a random count and choice of each chain's stored
    # templates; False: the first (best-ranked) ones, as at inference
    # AF3 SI 2.8 / Table 5: every sample's ref_pos gets a random rotation (uniform on SO(3)) and a
    # translation ~ N(0, conformer_translation_std² Å²) per reference space, after centring; AF3 does
    # it in training and at inference alike. False: ref_pos in the stored (CCD / RDKit) frame.
    augment_conformers: bool = True
    conformer_translation_std: float = 1.0  # Å (AF3: 1)
    seed: int = 0  # crops, MSA rows, templates and conformer augmentation are drawn

    # from (seed, epoch, index)
    def __post_init__(self) -> None:
        for name in ("crop_size", "msa_rows_per_sample", "msa_cycle_draws", "max_templates"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, numbers.Integral)):
                raise ValueError(f"{name} must be an integer, got {value!r}")
        if self.crop_size is not None and self.crop_size < 1:
            raise ValueError(f"crop_size must be at least 1 (or None for whole targets), got {self.crop_size}")
        if self.msa_rows_per_sample < 1:
            raise ValueError(f"msa_rows_per_sample must be at least 1, got {self.msa_rows_per_sample}")
        if self.msa_cycle_draws < 1:
            raise ValueError(f"msa_cycle_draws must be at least 1, got {self.msa_cycle_draws}")
        if self.max_templates is not None and self.max_templates < 0:
            raise ValueError(f"max_templates must be >= 0 (or None for every stored one), got {self.max_templates}")
        if not isinstance(self.random_templates, bool):
            raise ValueError(f"random_templates must be True or False, got {self.random_templates!r}")
        if not isinstance(self.augment_conformers, bool):
            raise ValueError(f"augment_conformers must be True or False, got {self.augment_conformers!r}")
        std = self.conformer_translation_std
        if isinstance(std, bool) or not isinstance(std, numbers.Real) or not 0.0 <= std < float("inf"):
            raise ValueError(f"conformer_translation_std must be a finite number >= 0 (Å), got {std!r}")
        probs = self.crop_mode_probs
        if (
            not isinstance(probs, (tuple, list))
            or len(probs) != len(CROP_MODES)
            or not all(isinstance(p, numbers.Real) and 0.0 <= p <= 1.0 for p in probs)
            or abs(sum(probs) - 1.0) > 1e-6
        ):
            raise ValueError(
                f"crop_mode_probs must be {len(CROP_MODES)} probabilities in [0, 1] summing to 1 "
                f"(for {', '.join(CROP_MODES)}), got {probs!r}"
            )
        object.__setattr__(self, "crop_mode_probs", tuple(float(p) for p in probs))

    @property
    def msa_pool_rows(self) -> int:
        """The most MSA rows a sample holds: its draws' union, the query shared."""
        return self.msa_cycle_draws * (self.msa_rows_per_sample - 1) + 1


def crop_mode_probs_from_spatial(spatial_crop_prob: float) -> tuple[float, float, float]:
    """crop_mode_probs for the old single setting p, the chance of a spatial crop (the train
    command's deprecated --spatial-crop-prob): (1 - p, p / 2, p / 2), AF3's even split of the
    spatial modes."""
    if isinstance(spatial_crop_prob, bool) or not (
        isinstance(spatial_crop_prob, numbers.Real) and 0.0 <= spatial_crop_prob <= 1.0
    ):
        raise ValueError(f"spatial_crop_prob must be in [0, 1], got {spatial_crop_prob!r}")
    spatial = float(spatial_crop_prob)
    return (1.0 - spatial, spatial / 2, spatial / 2)
