"""One featurecache training sample as Protenix 2.0's training example.

Protenix's dataset (protenix/data/pipeline/dataset.py, BaseSingleDataset.process_one) gives its
trainer, per example, four dicts: `input_feature_dict` (what its model and loss read),
`label_dict` (the cropped ground truth), `label_full_dict` (the ground truth of the chains the
crop touches, for its chain permutation) and `basic` (sizes it logs). `protenix_example` builds
them from a cropped sample of featurecache's loader (loader.crop_sample) and the whole record it
was cut from, with the keys, dtypes and shapes of Protenix's pipeline: the shapes of
protenix/data/utils.py get_data_shape_dict, the dtypes its dict_to_tensor and
data_type_transform leave (integers int64, one-hots and coordinates float32).

Where featurecache's record does not hold what Protenix's featurizer reads, the value is derived
as Protenix defines it (molecule ids from the token bonds, the centre atom by name, the template
pair features by Protenix's formulas); README "Protenix's trainer on the cache" lists the few
places where the result differs from what Protenix's own featurizer gives for the same mmCIF.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import torch

from featurecache.schema import GAP, NUM_RESTYPES, RESTYPES, UNK_PROTEIN

try:  # Protenix's own tables, so atom slots and residue classes are exactly its
    from protenix.data.constants import (
        RES_ATOMS_DICT,
        RESTYPE_PSEUDOBETA_INDEX,
        RESTYPE_RIGIDGROUP_DENSE_ATOM_IDX,
    )
except ImportError as error:  # pragma: no cover - the module is for Protenix users
    raise ImportError(
        f"featurecache.integrations.protenix needs Protenix ({error}): pip install protenix==2.0.0"
    ) from error

TEMPLATE_ROWS = 4  # Protenix's TemplateFeatureAssemblyLine(max_templates=4): every example has 4 rows
NUM_ELEMENTS = 128  # ref_element one-hot: atomic numbers 1..128 (AF3 SI Table 5)
NAME_CHAR_CLASSES = 64  # ref_atom_name_chars one-hot: ord(c) - 32, clipped to 0..63
DENSE_ATOMS = 24  # template_atom_positions slots per residue (Protenix's dense atom layout)
TEMPLATE_DISTOGRAM = (3.25, 50.75, 39)  # Protenix's DistogramFeaturesConfig: first, last lower edge; bins
_UNIT_VECTOR_EPSILON = 1e-6  # Protenix's compute_template_unit_vector
_PROTEIN_CLASSES = UNK_PROTEIN + 1  # residue classes 0..20 are amino acids (UNK included)


def protenix_example(
    sample: Mapping,
    record: Mapping[str, np.ndarray],
    *,
    chain_ids: list[str] | None = None,
    template_rows: int = TEMPLATE_ROWS,
    is_distillation: bool = False,
) -> dict:
    """Protenix's {"input_feature_dict", "label_dict", "label_full_dict", "basic"} for `sample`
    (a cropped sample of featurecache's loader) cut from `record` (its target's whole feature
    record); `chain_ids` (the record's metadata, asym_id order) name the chains in "basic"."""
    cut = {name: value.numpy() if isinstance(value, torch.Tensor) else value for name, value in sample.items()}
    atoms = record_atoms(cut, record)
    molecules = molecule_ids(record)
    spatial = "spatial" in str(cut.get("crop_mode", ""))  # Protenix: "spatial" in crop_method.lower()

    features = {
        **token_features(cut),
        **atom_features(cut),
        **representative_atom_masks(cut),
        **msa_features(cut),
        **template_features(cut, template_rows),
    }
    for name, values in molecules.items():
        features[name] = torch.from_numpy(values[atoms])
    features["token_bonds"] = dense_token_bonds(cut["token_bonds"], len(cut["restype"]))
    features["bond_mask"] = ligand_polymer_bond_mask(cut)
    resolution = float(cut["resolution"]) if "resolution" in cut else math.nan
    features["resolution"] = torch.tensor([-1.0 if is_distillation or math.isnan(resolution) else resolution])
    features["is_distillation"] = torch.tensor([is_distillation])
    features["atom_perm_list"] = atom_permutation_list(cut)

    labels = {
        "coordinate": torch.from_numpy(np.asarray(cut["atom_pos"], np.float32)),
        "coordinate_mask": torch.from_numpy(cut["atom_mask"].astype(np.int64)),
    }
    return {
        "input_feature_dict": features,
        "label_dict": labels,
        "label_full_dict": full_labels(record, molecules, atoms, spatial),
        "basic": basic_info(cut, features, chain_ids),
    }


# --- where the crop sits in the record --------------------------------------------------------


def record_atoms(sample: Mapping[str, np.ndarray], record: Mapping[str, np.ndarray]) -> np.ndarray:
    """The record's index of each of the sample's atoms. The loader keeps token_index (the
    record's numbering) and every atom of a kept token, grouped by token in the sample's token
    order; a sample that does not match its record this way is refused."""
    tokens = sample["token_index"].astype(np.int64)
    position = np.full(len(record["restype"]), -1, np.int64)
    position[tokens] = np.arange(len(tokens))
    atom_token_position = position[record["atom_to_token"]]
    atoms = np.flatnonzero(atom_token_position >= 0)
    atoms = atoms[np.argsort(atom_token_position[atoms], kind="stable")]
    if len(atoms) != len(sample["atom_to_token"]) or not (
        np.array_equal(record["ref_element"][atoms], sample["ref_element"])
        and np.array_equal(record["atom_mask"][atoms], sample["atom_mask"])
    ):
        raise ValueError(
            f"sample {sample.get('id')!r} does not match the record given with it "
            f"({len(sample['atom_to_token'])} atoms, the record's tokens hold {len(atoms)})"
        )
    return atoms


# --- tokens and atoms ---------------------------------------------------------------------------


def token_features(sample: Mapping[str, np.ndarray]) -> dict[str, torch.Tensor]:
    """Protenix's Featurizer.get_token_features: ids 0-based (its asym_id_int, entity_id_int,
    sym_id_int; featurecache's are 1-based), token_index renumbered after the crop."""
    restype = sample["restype"].astype(np.int64)
    return {
        "token_index": torch.arange(len(restype)),
        "residue_index": torch.from_numpy(sample["residue_index"].astype(np.int64)),
        "asym_id": torch.from_numpy(sample["asym_id"].astype(np.int64) - 1),
        "entity_id": torch.from_numpy(sample["entity_id"].astype(np.int64) - 1),
        "sym_id": torch.from_numpy(sample["sym_id"].astype(np.int64) - 1),
        "restype": torch.nn.functional.one_hot(torch.from_numpy(restype), NUM_RESTYPES).float(),
    }


def atom_features(sample: Mapping[str, np.ndarray]) -> dict[str, torch.Tensor]:
    """Reference-conformer and per-atom chain-type features (Featurizer.get_reference_features,
    get_extra_features); Protenix's is_protein / is_rna / is_dna / is_ligand are per atom."""
    atom_to_token = sample["atom_to_token"].astype(np.int64)
    elements = sample["ref_element"].astype(np.int64)
    element_one_hot = np.zeros((len(elements), NUM_ELEMENTS), np.int64)
    known = (elements >= 1) & (elements <= NUM_ELEMENTS)  # 0: an unknown element, an all-zero row
    element_one_hot[np.flatnonzero(known), elements[known] - 1] = 1
    name_chars = np.clip(sample["ref_atom_name_chars"].astype(np.int64), 0, NAME_CHAR_CLASSES - 1)
    frames = sample["frame_atom_index"].astype(np.int64)
    features = {
        "ref_pos": torch.from_numpy(np.asarray(sample["ref_pos"], np.float32)),
        "ref_mask": torch.from_numpy(sample["ref_mask"].astype(np.int64)),
        "ref_element": torch.from_numpy(element_one_hot),
        "ref_charge": torch.from_numpy(sample["ref_charge"].astype(np.int64)),
        "ref_atom_name_chars": torch.nn.functional.one_hot(torch.from_numpy(name_chars), NAME_CHAR_CLASSES),
        "ref_space_uid": torch.from_numpy(sample["ref_space_uid"].astype(np.int64)),
        "has_frame": torch.from_numpy((frames >= 0).all(axis=-1).astype(np.int64)),
        "frame_atom_index": torch.from_numpy(frames),  # -1 x 3 where has_frame is 0; its loss reads has_frame rows
        "atom_to_token_idx": torch.from_numpy(atom_to_token),
        "atom_to_tokatom_idx": torch.from_numpy(atom_in_token_slots(sample)),
    }
    for kind in ("protein", "rna", "dna", "ligand"):
        features[f"is_{kind}"] = torch.from_numpy(sample[f"is_{kind}"][atom_to_token].astype(np.int64))
    return features


def atom_names(name_chars: np.ndarray) -> np.ndarray:
    """AF3's atom-name encoding (ord(c) - 32 per character, 0-padded) decoded, as a string array."""
    text = np.ascontiguousarray(np.asarray(name_chars).astype(np.uint8) + 32)  # padding becomes spaces
    return np.char.rstrip(text.view("S4").ravel().astype(str))


def one_atom_tokens(atom_to_token: np.ndarray, num_tokens: int) -> np.ndarray:
    """[token] bool: tokens of a single atom (ligands, modified residues: tokenized per atom)."""
    return np.bincount(atom_to_token, minlength=num_tokens) == 1


def atom_in_token_slots(sample: Mapping[str, np.ndarray]) -> np.ndarray:
    """Protenix's tokatom_idx: an atom's slot in its standard residue's atom order
    (protenix.data.constants.RES_ATOMS_DICT); 0 for atoms of one-atom tokens."""
    atom_to_token = sample["atom_to_token"].astype(np.int64)
    single = one_atom_tokens(atom_to_token, len(sample["restype"]))[atom_to_token]
    names = atom_names(sample["ref_atom_name_chars"])
    residues = np.array(RESTYPES)[sample["restype"].astype(np.int64)[atom_to_token]]
    return np.array(
        [
            0 if alone else RES_ATOMS_DICT.get(residue, {}).get(name, 0)
            for alone, residue, name in zip(single, residues, names)
        ],
        np.int64,
    )


def centre_atom_mask(arrays: Mapping[str, np.ndarray]) -> np.ndarray:
    """[atom] bool: each token's centre atom (Protenix's centre_atom_mask, AF3 SI 2.6): CA of an
    amino acid, C1' of a nucleotide, the atom itself of a one-atom token. `arrays`: a sample or
    a record."""
    atom_to_token = arrays["atom_to_token"].astype(np.int64)
    num_tokens = len(arrays["restype"])
    single = one_atom_tokens(atom_to_token, num_tokens)
    names = atom_names(arrays["ref_atom_name_chars"])
    wanted = np.where(arrays["restype"].astype(np.int64) < _PROTEIN_CLASSES, "CA", "C1'")[atom_to_token]
    mask = single[atom_to_token] | (names == wanted)
    found = np.bincount(atom_to_token[mask], minlength=num_tokens)
    if np.any(found != 1):
        token = int(np.flatnonzero(found != 1)[0])
        raise ValueError(
            f"token {token} ({RESTYPES[int(arrays['restype'][token])]}) has {found[token]} centre "
            "atoms (CA / C1'), expected one"
        )
    return mask


def representative_atom_masks(sample: Mapping[str, np.ndarray]) -> dict[str, torch.Tensor]:
    """Featurizer.get_mask_features' per-atom masks: the centre atom (PAE), the pLDDT atom (the
    centre atom of a standard residue), the distogram atom and the atoms of modified residues
    (one-atom tokens of polymer chains)."""
    atom_to_token = sample["atom_to_token"].astype(np.int64)
    num_atoms, num_tokens = len(atom_to_token), len(sample["restype"])
    single = one_atom_tokens(atom_to_token, num_tokens)[atom_to_token]
    centre = centre_atom_mask(sample)
    distogram = np.zeros(num_atoms, bool)
    distogram[sample["distogram_atom_index"].astype(np.int64)] = True
    modified = single & ~sample["is_ligand"][atom_to_token]
    return {
        "pae_rep_atom_mask": torch.from_numpy(centre.astype(np.int64)),
        "plddt_m_rep_atom_mask": torch.from_numpy((centre & ~single).astype(np.int64)),
        "distogram_rep_atom_mask": torch.from_numpy(distogram.astype(np.int64)),
        "modified_res_mask": torch.from_numpy(modified.astype(np.int64)),
    }


# --- bonds ----------------------------------------------------------------------------------------


def dense_token_bonds(edges: np.ndarray, num_tokens: int) -> torch.Tensor:
    """[token, token] float32, 1 where two tokens are bonded (featurecache stores the edge list)."""
    bonds = np.zeros((num_tokens, num_tokens), np.float32)
    edges = edges.reshape(-1, 2).astype(np.int64)
    bonds[edges[:, 0], edges[:, 1]] = bonds[edges[:, 1], edges[:, 0]] = 1.0
    return torch.from_numpy(bonds)


def ligand_polymer_bond_mask(sample: Mapping[str, np.ndarray]) -> torch.Tensor:
    """[atom, atom] int64, 1 at the two atoms of each bond between a ligand of more than one atom
    and a polymer chain (Protenix's get_ligand_polymer_bond_mask, for its bond loss). A token bond
    names tokens; on a standard residue the bonded atom is the one nearest the ligand atom in the
    ground truth (a covalent bond is at most 2.4 Å here, the residue's other atoms farther)."""
    atom_to_token = sample["atom_to_token"].astype(np.int64)
    num_atoms = len(atom_to_token)
    mask = np.zeros((num_atoms, num_atoms), np.int64)
    ligand = sample["is_ligand"].astype(bool)
    chain_atoms = np.bincount(sample["asym_id"][atom_to_token], minlength=int(sample["asym_id"].max(initial=0)) + 1)
    not_ion = chain_atoms[sample["asym_id"]] > 1
    positions, resolved = sample["atom_pos"], sample["atom_mask"].astype(bool)
    for first, second in sample["token_bonds"].reshape(-1, 2).astype(np.int64):
        for ligand_token, polymer_token in ((first, second), (second, first)):
            if not (ligand[ligand_token] and not_ion[ligand_token] and not ligand[polymer_token]):
                continue
            ligand_atom = int(np.flatnonzero(atom_to_token == ligand_token)[0])
            candidates = np.flatnonzero((atom_to_token == polymer_token) & resolved)
            if not resolved[ligand_atom] or candidates.size == 0:
                continue  # no ground truth to place the bond on (featurecache keeps bonds it measured)
            distances = np.linalg.norm(positions[candidates] - positions[ligand_atom], axis=-1)
            polymer_atom = int(candidates[np.argmin(distances)])
            mask[ligand_atom, polymer_atom] = mask[polymer_atom, ligand_atom] = 1
    return torch.from_numpy(mask)


# --- molecules (Protenix's chain permutation ids) ---------------------------------------------------


def molecule_ids(record: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Per atom of a whole record, Protenix's mol_id (chains joined by covalent bonds, bonds
    between two polymer chains not counted), entity_mol_id (molecules of the same entities and
    atoms share it) and mol_atom_index (the atom's number in its molecule), 0-based
    (parser.AddAtomArrayAnnot.find_equiv_mol_and_assign_ids, on the record's token bonds)."""
    atom_to_token = record["atom_to_token"].astype(np.int64)
    asym = record["asym_id"].astype(np.int64)
    chains = np.unique(asym)
    polymer = {
        int(chain): bool(np.any((record["is_protein"] | record["is_rna"] | record["is_dna"])[asym == chain]))
        for chain in chains
    }
    root = {int(chain): int(chain) for chain in chains}

    def find(chain: int) -> int:
        while root[chain] != chain:
            chain = root[chain]
        return chain

    for first, second in record["token_bonds"].reshape(-1, 2).astype(np.int64):
        a, b = int(asym[first]), int(asym[second])
        if a != b and not (polymer[a] and polymer[b]):
            low, high = sorted((find(a), find(b)))
            root[high] = low
    molecule_of_chain, molecule_numbers = np.zeros(int(chains.max()) + 1, np.int64), {}
    for chain in chains.tolist():  # numbered by their first chain, in asym_id order
        molecule_of_chain[chain] = molecule_numbers.setdefault(find(chain), len(molecule_numbers))
    atom_chain = asym[atom_to_token]
    mol_id = molecule_of_chain[atom_chain]

    # entity_mol_id: Protenix groups molecules by their sorted entity ids, then by atom names
    entity_of_chain = {int(chain): int(record["entity_id"][asym == chain][0]) for chain in chains}
    names = np.ascontiguousarray(record["ref_atom_name_chars"])
    variants: dict[tuple, list[tuple[bytes, int]]] = {}
    entity_mol_of_molecule, next_number = {}, 0
    for molecule in range(len(molecule_numbers)):
        atoms = mol_id == molecule
        key = tuple(sorted(entity_of_chain[chain] for chain in np.unique(atom_chain[atoms]).tolist()))
        signature = names[atoms].tobytes()
        for known, number in variants.setdefault(key, []):
            if known == signature:
                entity_mol_of_molecule[molecule] = number
                break
        else:
            entity_mol_of_molecule[molecule] = next_number
            variants[key].append((signature, next_number))
            next_number += 1
    entity_mol_id = np.array([entity_mol_of_molecule[m] for m in range(len(molecule_numbers))], np.int64)[mol_id]

    mol_atom_index = np.zeros(len(mol_id), np.int64)
    for molecule in range(len(molecule_numbers)):
        atoms = np.flatnonzero(mol_id == molecule)
        mol_atom_index[atoms] = np.arange(len(atoms))
    return {"mol_id": mol_id, "entity_mol_id": entity_mol_id, "mol_atom_index": mol_atom_index}


def full_labels(
    record: Mapping[str, np.ndarray], molecules: Mapping[str, np.ndarray], atoms: np.ndarray, spatial: bool
) -> dict[str, torch.Tensor]:
    """Protenix's label_full_dict (Featurizer.get_gt_full_complex_features): the record's atoms
    that are, in some copy of a molecule, an atom of the crop (same entity_mol_id and
    mol_atom_index), for a spatial crop only in the molecules the crop touches."""
    entity_mol, index = molecules["entity_mol_id"], molecules["mol_atom_index"]
    pair = entity_mol * (int(index.max(initial=0)) + 1) + index
    keep = np.isin(pair, pair[atoms])
    if spatial:
        keep &= np.isin(molecules["mol_id"], molecules["mol_id"][atoms])
    return {
        "coordinate": torch.from_numpy(np.asarray(record["atom_pos"][keep], np.float32)),
        "coordinate_mask": torch.from_numpy(record["atom_mask"][keep].astype(np.int64)),
        "entity_mol_id": torch.from_numpy(entity_mol[keep]),
        "mol_id": torch.from_numpy(molecules["mol_id"][keep]),
        "mol_atom_index": torch.from_numpy(index[keep]),
        "pae_rep_atom_mask": torch.from_numpy(centre_atom_mask(record)[keep].astype(np.int64)),
    }


def atom_permutation_list(sample: Mapping[str, np.ndarray]) -> list[list[int]]:
    """Protenix's atom_perm_list: per atom, its index within its residue (a run of one
    ref_space_uid) under the identity and then under each of the residue's symmetries
    (featurecache's atom_permutations, which leave the identity out)."""
    permutations = sample["atom_permutations"].astype(np.int64)
    uid = sample["ref_space_uid"]
    starts = np.flatnonzero(np.r_[True, uid[1:] != uid[:-1]])
    start_of_atom = starts[np.searchsorted(starts, np.arange(len(uid)), side="right") - 1]
    # identity first; the valid columns come first in each row (-1 past a residue's count)
    within = np.concatenate([np.arange(len(uid))[:, None], permutations], axis=1) - start_of_atom[:, None]
    lengths = 1 + (permutations >= 0).sum(axis=1)
    return [row[:length] for row, length in zip(within.tolist(), lengths.tolist())]


# --- MSA and templates ----------------------------------------------------------------------------


def msa_features(sample: Mapping[str, np.ndarray]) -> dict[str, torch.Tensor]:
    """MSAFeat.to_dict's features of the sample's rows (Protenix's model draws its own subset of
    them each step): deletion counts as has_deletion and 2/pi arctan(d / 3). The row counts
    are what Protenix logs ("basic"); its model and loss do not read them."""
    deletions = np.asarray(sample["deletion_matrix"], np.float32)
    paired = int(sample["msa_is_paired"].sum())
    unpaired = int(len(deletions) - paired)
    has = {kind: bool(sample[f"is_{kind}"].any()) for kind in ("protein", "rna")}
    return {
        "msa": torch.from_numpy(sample["msa"].astype(np.int64)),
        "has_deletion": torch.from_numpy(np.clip(deletions, 0.0, 1.0)),
        "deletion_value": torch.from_numpy((np.arctan(deletions / 3.0) * (2.0 / np.pi)).astype(np.float32)),
        "profile": torch.from_numpy(np.asarray(sample["msa_profile"], np.float32)),
        "deletion_mean": torch.from_numpy(np.asarray(sample["deletion_mean"], np.float32)),
        "prot_pair_num_alignments": torch.tensor(paired if has["protein"] else 0),
        "prot_unpair_num_alignments": torch.tensor(unpaired if has["protein"] else 0),
        "rna_pair_num_alignments": torch.tensor(0),  # featurecache pairs protein rows only
        "rna_unpair_num_alignments": torch.tensor(unpaired if has["rna"] else 0),
    }


def template_features(sample: Mapping[str, np.ndarray], rows: int = TEMPLATE_ROWS) -> dict[str, torch.Tensor]:
    """Protenix's template features (Templates.as_protenix_dict) of the sample's drawn templates,
    `rows` rows (empty ones after them: gap residues, nothing present), from featurecache's
    N, CA, C and pseudo-beta positions placed in Protenix's dense atom slots."""
    restype = sample["template_restype"].astype(np.int64)
    drawn, num_tokens = restype.shape
    if drawn > rows:
        raise ValueError(
            f"sample {sample.get('id')!r} has {drawn} template rows, Protenix's template features "
            f"hold {rows}: draw at most {rows} templates per chain (max_templates)"
        )
    aatype = np.full((rows, num_tokens), GAP, np.int64)
    aatype[:drawn] = restype
    positions = np.zeros((rows, num_tokens, DENSE_ATOMS, 3), np.float32)
    present = np.zeros((rows, num_tokens, DENSE_ATOMS), bool)
    amino_acid = restype < UNK_PROTEIN
    template, token = np.nonzero(amino_acid)
    pseudo_beta_slot = RESTYPE_PSEUDOBETA_INDEX[restype[template, token]]  # CB (4), or CA (1) for glycine
    positions[template, token, pseudo_beta_slot] = sample["template_pseudo_beta_pos"][template, token]
    present[template, token, pseudo_beta_slot] = sample["template_pseudo_beta_mask"][template, token]
    positions[template, token, :3] = sample["template_backbone_pos"][template, token]  # N, CA, C
    present[template, token, :3] = sample["template_backbone_mask"][template, token]
    # An unknown residue: Protenix's atom37-to-dense map sends every slot of UNK to atom 0 (N)
    template, token = np.nonzero(restype == UNK_PROTEIN)
    positions[template, token] = sample["template_backbone_pos"][template, token, 0][:, None]
    present[template, token] = sample["template_backbone_mask"][template, token, 0][:, None]
    positions *= present[..., None]

    pseudo_beta_mask = np.zeros((rows, num_tokens, num_tokens), np.float32)
    distogram = np.zeros((rows, num_tokens, num_tokens, TEMPLATE_DISTOGRAM[2]), np.float32)
    unit_vector = np.zeros((rows, num_tokens, num_tokens, 3), np.float32)
    backbone_mask = np.zeros((rows, num_tokens, num_tokens), np.float32)
    for row in np.flatnonzero(present.any(axis=(1, 2))):  # a row with no atom present stays zero
        slot = RESTYPE_PSEUDOBETA_INDEX[aatype[row]]
        beta = positions[row, np.arange(num_tokens), slot]
        beta_present = present[row, np.arange(num_tokens), slot].astype(np.float32)
        pseudo_beta_mask[row] = beta_present[:, None] * beta_present[None, :]
        distogram[row] = template_distogram(beta) * pseudo_beta_mask[row][..., None]
        vectors, frames_present = template_unit_vectors(aatype[row], positions[row], present[row])
        unit_vector[row] = vectors * frames_present[..., None]
        backbone_mask[row] = frames_present
    return {
        "template_aatype": torch.from_numpy(aatype),
        "template_atom_positions": torch.from_numpy(positions),
        "template_atom_mask": torch.from_numpy(present),
        "template_pseudo_beta_mask": torch.from_numpy(pseudo_beta_mask),
        "template_distogram": torch.from_numpy(distogram),
        "template_unit_vector": torch.from_numpy(unit_vector),
        "template_backbone_frame_mask": torch.from_numpy(backbone_mask),
    }


def template_distogram(positions: np.ndarray) -> np.ndarray:
    """[n, n, 39] one-hot of squared distances between Protenix's bin edges (its
    TemplateFeatures.dgram_from_positions: lower edges 3.25..50.75 Å, the last bin open)."""
    first, last, bins = TEMPLATE_DISTOGRAM
    lower = np.square(np.linspace(first, last, bins, dtype=np.float32))
    upper = np.append(lower[1:], np.float32(1e8))
    difference = positions[:, None, :] - positions[None, :, :]
    squared = np.einsum("ijk,ijk->ij", difference, difference)[..., None]
    return ((squared > lower) & (squared < upper)).astype(np.float32)


def template_unit_vectors(
    aatype: np.ndarray, positions: np.ndarray, present: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Protenix's TemplateFeatures.compute_template_unit_vector: the direction from each
    residue's CA to every other CA in its backbone frame (CA origin, C - CA the first axis),
    and the 2-D mask of residues with N, CA and C present."""
    c_slot, ca_slot, n_slot = RESTYPE_RIGIDGROUP_DENSE_ATOM_IDX[aatype, 0].T
    residues = np.arange(len(aatype))
    c, ca, n = (positions[residues, slot] for slot in (c_slot, ca_slot, n_slot))
    frame_present = (present[residues, c_slot] & present[residues, ca_slot] & present[residues, n_slot]).astype(
        np.float32
    )
    first = c - ca
    first = first / (np.sqrt(np.einsum("ij,ij->i", first, first))[:, None] + _UNIT_VECTOR_EPSILON)
    second = n - ca
    second = second - np.einsum("ij,ij->i", second, first)[:, None] * first
    second = second / (np.sqrt(np.einsum("ij,ij->i", second, second))[:, None] + _UNIT_VECTOR_EPSILON)
    rotation = np.stack([first, second, np.cross(first, second)], axis=-1)  # [n, 3, 3], axes as columns
    vectors = np.einsum("ilk,ijl->ijk", rotation, ca[None, :, :] - ca[:, None, :])
    vectors = vectors / (np.sqrt(np.einsum("ijk,ijk->ij", vectors, vectors))[..., None] + _UNIT_VECTOR_EPSILON)
    return vectors.astype(np.float32), frame_present[:, None] * frame_present[None, :]


# --- what Protenix logs ------------------------------------------------------------------------------


def basic_info(
    sample: Mapping[str, np.ndarray], features: Mapping[str, torch.Tensor], chain_ids: list[str] | None
) -> dict:
    """Protenix's "basic" dict: the example's sizes and chain ids (its trainer logs them)."""
    asym = np.unique(sample["asym_id"])
    basic = {
        "pdb_id": str(sample.get("id", "")),
        "N_asym": torch.tensor([len(asym)]),
        "N_token": torch.tensor([len(sample["restype"])]),
        "N_atom": torch.tensor([len(sample["atom_to_token"])]),
        "N_msa": torch.tensor([len(sample["msa"])]),
        "bioassembly_dict_fpath": None,  # the example comes from a cache record, not a bioassembly file
        "N_msa_prot_pair": features["prot_pair_num_alignments"].reshape(1),
        "N_msa_prot_unpair": features["prot_unpair_num_alignments"].reshape(1),
        "N_msa_rna_pair": features["rna_pair_num_alignments"].reshape(1),
        "N_msa_rna_unpair": features["rna_unpair_num_alignments"].reshape(1),
        "chain_id": [chain_ids[int(chain) - 1] if chain_ids else str(int(chain)) for chain in asym],
    }
    atom_to_token = features["atom_to_token_idx"]
    for kind, short in (("protein", "prot"), ("ligand", "lig"), ("rna", "rna"), ("dna", "dna")):
        atoms = features[f"is_{kind}"].bool()
        basic[f"N_{short}_atom"] = torch.tensor([int(atoms.sum())])
        basic[f"N_{short}_token"] = torch.tensor([len(torch.unique(atom_to_token[atoms]))])
    return basic
