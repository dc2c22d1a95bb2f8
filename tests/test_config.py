from featurecache.config import FeatureConfig, fingerprint, stable_hash


def test_fingerprint_is_stable_and_sensitive():
    assert fingerprint(FeatureConfig(), "v1") == fingerprint(FeatureConfig(), "v1")
    assert fingerprint(FeatureConfig(), "v1") != fingerprint(FeatureConfig(msa_rows_stored=8), "v1")
    assert stable_hash({"a": 1, "b": 2}) == stable_hash({"b": 2, "a": 1})


def test_renamed_setting_keeps_the_fingerprints_of_existing_caches():
    # Values computed before msa_rows_stored was renamed from max_msa_rows: records and
    # manifests written then must stay current.
    assert fingerprint(FeatureConfig().fingerprint_fields(), 1, "mode") == "5fc24a48cd24b9ad"
    assert FeatureConfig().config_fingerprint() == "ebcd61e321dfc258"
    changed = FeatureConfig(msa_rows_stored=7, zstd_level=0)
    assert fingerprint(changed.fingerprint_fields(), 1, "mode") == "c650c1b8930eb45c"
    assert changed.config_fingerprint() == "3c20f4af29806d26"
