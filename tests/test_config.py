from featurecache.config import FeatureConfig, fingerprint, stable_hash


def test_fingerprint_is_stable_and_sensitive():
    assert fingerprint(FeatureConfig(), "v1") == fingerprint(FeatureConfig(), "v1")
    assert fingerprint(FeatureConfig(), "v1") != fingerprint(FeatureConfig(msa_rows_stored=8), "v1")
    assert stable_hash({"a": 1, "b": 2}) == stable_hash({"b": 2, "a": 1})


def test_renamed_settings_are_hashed_under_their_old_names():
    # A rename alone leaves records current: fingerprints hash max_msa_rows, max_templates and
    # template_max_release_gap_days, whatever the settings are called now.
    fields = FeatureConfig().fingerprint_fields()
    assert {"max_msa_rows", "max_templates", "template_max_release_gap_days"} <= set(fields)
    assert not {"msa_rows_stored", "max_templates_stored", "template_release_gap_days"} & set(fields)


def test_fingerprints_are_pinned_and_template_settings_made_older_caches_stale():
    # Pinned so that an accidental change shows. Storing AF3's 20 templates per chain with its
    # 60-day gap and filters changed what a record holds: records of the defaults before
    # (5fc24a48cd24b9ad / ebcd61e321dfc258) are stale and recomputed.
    assert fingerprint(FeatureConfig().fingerprint_fields(), 1, "mode") == "400d69d22b0874ea"
    assert FeatureConfig().config_fingerprint() == "f6bbf4db9182f1de"
    changed = FeatureConfig(msa_rows_stored=7, zstd_level=0)
    assert fingerprint(changed.fingerprint_fields(), 1, "mode") == "dac03f81581d21f8"
    assert changed.config_fingerprint() == "e206602b157d0b2f"
