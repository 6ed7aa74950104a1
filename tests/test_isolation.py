"""The test suite's own isolation: nothing one test changes in the process reaches the next."""

import os


def test_a_tests_environment_changes_do_not_leak():
    """conftest restores os.environ after every test (set, changed or removed keys alike)."""
    from conftest import environment_restored
    os.environ["FEDSL_LEAK_PROBE"] = "kept"
    with environment_restored():
        os.environ["FEDSL_LEAK_NEW"] = "1"
        os.environ["FEDSL_LEAK_PROBE"] = "changed"
    try:
        assert "FEDSL_LEAK_NEW" not in os.environ and os.environ["FEDSL_LEAK_PROBE"] == "kept"
        with environment_restored():
            del os.environ["FEDSL_LEAK_PROBE"]
        assert os.environ["FEDSL_LEAK_PROBE"] == "kept"
    finally:
        del os.environ["FEDSL_LEAK_PROBE"]
