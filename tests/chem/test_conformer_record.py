"""Conformer cache keys and the conversion to and from record arrays."""

import numpy as np
import pytest

from featurecache.chem import (
    CONFORMER_ARRAYS,
    ConformerSettings,
    SmilesError,
    component_conformer,
    conformer_from_arrays,
    conformer_key,
    conformer_to_arrays,
    decode_atom_names,
    encode_atom_names,
    load_ccd,
    smiles_conformer,
)
from featurecache.store.codec import decode_record, encode_record
from tests.chem._components import write_components_cif


@pytest.fixture(scope="module")
def ccd():
    return load_ccd()


def test_atom_names_use_af3_encoding():
    encoded = encode_atom_names(["CA", "O5'", "HO5'", "C"])
    assert encoded.dtype == np.uint8 and encoded.shape == (4, 4)
    assert encoded[0].tolist() == [ord("C") - 32, ord("A") - 32, 0, 0]
    assert encoded[1].tolist() == [47, 21, 7, 0]
    assert decode_atom_names(encoded).tolist() == ["CA", "O5'", "HO5'", "C"]
    assert decode_atom_names(encode_atom_names([])).tolist() == []
    with pytest.raises(ValueError, match="'CL123'"):
        encode_atom_names(["CL123"])
    with pytest.raises(ValueError, match="'ca'"):
        encode_atom_names(["ca"])  # lower case is outside AF3's 64 classes


@pytest.mark.parametrize("name", ["ATP", "CUZ", "IRI", "UNL", "aspirin"])
def test_arrays_round_trip_through_the_record_codec(ccd, name):
    if name == "aspirin":
        conformer = smiles_conformer("CC(=O)Oc1ccccc1C(=O)O")
    else:
        conformer = component_conformer(ccd.component(name))
    arrays, meta = conformer_to_arrays(conformer)
    assert set(arrays) == {spec.name for spec in CONFORMER_ARRAYS}
    for spec in CONFORMER_ARRAYS:
        assert arrays[spec.name].dtype == spec.dtype
        assert arrays[spec.name].ndim == len(spec.axes)
    assert arrays["ref_pos"].shape == (conformer.num_atoms, 3)
    assert meta["source"] == conformer.source
    blob = encode_record("conformer", arrays, meta, "fingerprint", "", 1)
    record = decode_record(blob)
    restored = conformer_from_arrays(record.arrays, record.meta)
    for field in ("atom_names", "elements", "charges", "positions", "mask", "bonds", "bond_orders"):
        np.testing.assert_array_equal(getattr(restored, field), getattr(conformer, field), err_msg=field)
    assert (restored.name, restored.kind, restored.source, restored.sanitization, restored.fallback) == (
        conformer.name,
        conformer.kind,
        conformer.source,
        conformer.sanitization,
        conformer.fallback,
    )
    assert (
        meta["fallback"]
        == {"ATP": None, "CUZ": "embedding_failed", "IRI": "bond_lengths", "UNL": None, "aspirin": None}[name]
    )


def test_from_arrays_names_what_is_wrong(ccd):
    arrays, meta = conformer_to_arrays(component_conformer(ccd.component("ALA")))
    with pytest.raises(ValueError, match="conformer 'ALA': missing array 'ref_mask'"):
        conformer_from_arrays({k: v for k, v in arrays.items() if k != "ref_mask"}, meta)
    with pytest.raises(ValueError, match="ref_pos has dtype float64"):
        conformer_from_arrays({**arrays, "ref_pos": arrays["ref_pos"].astype(np.float64)}, meta)
    with pytest.raises(ValueError, match="missing metadata 'source'"):
        conformer_from_arrays(arrays, {k: v for k, v in meta.items() if k != "source"})
    with pytest.raises(ValueError, match="conformer fallback 'bonds' is not one of"):
        conformer_from_arrays(arrays, {**meta, "fallback": "bonds"})


def test_keys_follow_code_ccd_version_and_settings(ccd, tmp_path):
    settings = ConformerSettings()
    key = conformer_key("ATP", settings, ccd)
    assert key.startswith("ccd:ATP:") and key == conformer_key("ATP", ConformerSettings(), ccd)
    assert conformer_key("ATP", ConformerSettings(seed=1), ccd) != key
    assert conformer_key("ATP", ConformerSettings(force_field="none"), ccd) != key
    assert conformer_key("ATP", ConformerSettings(max_bond_deviation=0.3), ccd) != key
    assert conformer_key("ATP", ConformerSettings(max_bond_deviation=float("inf")), ccd) != key
    assert conformer_key("ADP", settings, ccd) != key
    user_file = tmp_path / "components.cif"
    write_components_cif(user_file, ["ATP"])
    assert conformer_key("ATP", settings, load_ccd(user_file)) != key
    assert len(key.encode()) < 100


def test_smiles_keys_are_canonical_and_never_mistaken_for_codes(ccd):
    settings = ConformerSettings()
    aspirin = conformer_key("CC(=O)Oc1ccccc1C(=O)O", settings)
    assert aspirin == conformer_key("OC(=O)c1ccccc1OC(C)=O", settings)
    assert aspirin.startswith("smiles:")
    # "CO" is cobalt's CCD code and methanol's SMILES
    assert conformer_key("CO", settings, ccd) != conformer_key("CO", settings)
    long_smiles = "C" * 600  # keys stay short enough for LMDB (511 bytes)
    assert len(conformer_key(long_smiles, settings).encode()) < 100
    with pytest.raises(SmilesError, match="'C1CC'"):
        conformer_key("C1CC", settings)
