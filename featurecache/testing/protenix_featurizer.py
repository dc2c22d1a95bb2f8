"""Protenix 2.0's own data pipeline (its mmCIF parser, tokenizer and Featurizer) on a CPU, as the
reference of featurecache.integrations.protenix (tests/integrations).

Protenix reads chemistry from a components.cif and a pickle of RDKit molecules it downloads
(~400 MB); `use_bundled_ccd` gives it the entries one mmCIF needs instead, written from the CCD
featurecache reads (biotite's bundled copy), with each entry's CCD ideal coordinates (else model
coordinates) as the reference conformer. Its parser builds biological assembly 1 from the
file's operators; featurecache reads a file's chains as they are, so `AsymmetricUnitParser`
does too. Its data modules need pandas, scikit-learn and biopython (the test extra) besides
what its model needs.
"""

from __future__ import annotations

import io
import pathlib
from collections.abc import Sequence

import gemmi
import numpy as np
from biotite.structure.io import pdbx

from featurecache.chem.ccd import load_ccd
from featurecache.chem.molecule import molecule_from_component


def import_protenix_data() -> None:
    """Make Protenix's data modules importable, or raise ImportError saying how."""
    try:
        import Bio  # noqa: F401 - its template parser's import
        import pandas  # noqa: F401 - its parser's tables
        import sklearn  # noqa: F401 - its featurizer's KD-trees
    except ImportError as error:
        raise ImportError(
            f"Protenix's data pipeline needs pandas, scikit-learn and biopython ({error}): "
            "pip install -e '.[test]' (./setup.sh does)"
        ) from error


def ccd_codes(mmcif: pathlib.Path) -> list[str]:
    """Every component an mmCIF names: its residues and its polymers' full sequences."""
    block = gemmi.cif.read(str(mmcif)).sole_block()
    codes = set(block.find_values("_atom_site.label_comp_id")) | set(block.find_values("_entity_poly_seq.mon_id"))
    return sorted(codes | {"MET"})  # its parser renames MSE to MET


def use_bundled_ccd(codes: Sequence[str], folder: pathlib.Path) -> None:
    """Point Protenix's CCD access (protenix.data.core.ccd) at `codes` from featurecache's CCD:
    a components.cif written into `folder` and RDKit molecules with their atom names, reference
    conformer and mask as its cache holds them (attributes atom_map, ref_conf_id, ref_mask)."""
    import biotite.structure.info as biotite_info
    import protenix.data.core.ccd as protenix_ccd
    from rdkit import Chem

    ccd = load_ccd()
    components = pdbx.CIFFile()
    molecules = {}
    for code in codes:
        block = pdbx.CIFBlock()
        for name in ("chem_comp", "chem_comp_atom", "chem_comp_bond"):
            category = biotite_info.get_from_ccd(name, code)
            if category is not None:
                block[name] = pdbx.CIFCategory(
                    {
                        column_name: pdbx.CIFColumn(
                            pdbx.CIFData(column.as_array(str)),
                            None if column.mask is None else pdbx.CIFData(column.mask.array),
                        )
                        for column_name, column in category.items()
                    }
                )
        components[code] = block
        component = ccd.component(code)
        molecule, _ = molecule_from_component(component)
        positions = np.where(component.ideal_missing[:, None], component.model_pos, component.ideal_pos)
        conformer = Chem.Conformer(molecule.GetNumAtoms())
        for index, position in enumerate(positions.astype(float).tolist()):
            conformer.SetAtomPosition(index, position)
        molecule.AddConformer(conformer, assignId=True)
        molecule.atom_map = {str(name): index for index, name in enumerate(component.atom_names)}
        molecule.ref_conf_id = 0
        molecule.ref_mask = ~(component.ideal_missing & component.model_missing)
        molecules[code] = molecule
    text = io.StringIO()
    components.write(text)
    path = folder / "components.cif"
    path.write_text(text.getvalue())
    protenix_ccd.COMPONENTS_FILE = str(path)
    protenix_ccd.biotite_load_ccd_cif.cache_clear()
    for cached in (protenix_ccd.get_component_atom_array, protenix_ccd.get_ccd_ref_info):
        cached.cache_clear()
    # its molecule cache: Protenix's only way in, short of the pickle file it would download
    protenix_ccd._ccd_rdkit_mols = molecules


def asymmetric_unit_parser():
    """Protenix's MMCIFParser reading a file's chains as they are (no assembly operators; a
    file without _pdbx_struct_assembly counts its polymer chains itself)."""
    from protenix.data.core.parser import MMCIFParser

    class AsymmetricUnitParser(MMCIFParser):
        def expand_assembly(self, structure, assembly_id: str = "1"):
            return structure

        def num_assembly_polymer_chains(self, assembly_id: str = "1") -> int:
            atom_site = self.cif.block["atom_site"]
            polymer = set(self.entity_poly_type)
            return len(
                {
                    chain
                    for chain, entity in zip(
                        atom_site["label_asym_id"].as_array(str), atom_site["label_entity_id"].as_array(str)
                    )
                    if entity in polymer
                }
            )

    return AsymmetricUnitParser


def protenix_bioassembly(mmcif: pathlib.Path, chain_ids: Sequence[str]) -> dict:
    """Protenix's bioassembly dict (atom array with its annotations, token array) of `mmcif`,
    restricted to `chain_ids` (the chains featurecache's curation kept, label_asym_id)."""
    from protenix.data.tokenizer import AtomArrayTokenizer

    parser = asymmetric_unit_parser()(mmcif_file=mmcif)
    bioassembly = parser.get_bioassembly()
    atoms = bioassembly["atom_array"]
    atoms = atoms[np.isin(atoms.label_asym_id, list(chain_ids))]
    atoms.set_annotation("resolution", [parser.resolution] * len(atoms))
    bioassembly["atom_array"] = atoms
    bioassembly["token_array"] = AtomArrayTokenizer(atoms).get_token_array()
    return bioassembly


def protenix_features(bioassembly: dict, token_indices: np.ndarray, spatial: bool) -> dict:
    """What Protenix's dataset (BaseSingleDataset.get_feature_and_label) gives for the tokens
    `token_indices` of `bioassembly`: its Featurizer's input features, atom permutations,
    labels and full-complex labels, reference conformers not augmented; "names" holds the
    (residue names, atom names) of the label dicts' atoms."""
    from protenix.data.core.featurizer import Featurizer
    from protenix.utils.cropping import CropData

    tokens, atoms = CropData.select_by_token_indices(
        token_array=bioassembly["token_array"],
        atom_array=bioassembly["atom_array"],
        selected_token_indices=np.asarray(token_indices),
    )
    featurizer = Featurizer(cropped_token_array=tokens, cropped_atom_array=atoms, ref_pos_augment=False)
    features = featurizer.get_all_input_features()
    features["atom_perm_list"] = featurizer.get_atom_permutation_list()
    full, full_atoms = Featurizer.get_gt_full_complex_features(
        atom_array=bioassembly["atom_array"], cropped_atom_array=atoms, get_cropped_asym_only=spatial
    )
    return {
        "input_feature_dict": features,
        "label_dict": featurizer.get_labels(),
        "label_full_dict": full,
        "names": {
            "label_dict": (np.array(atoms.res_name), np.array(atoms.atom_name)),
            "label_full_dict": (np.array(full_atoms.res_name), np.array(full_atoms.atom_name)),
        },
    }
