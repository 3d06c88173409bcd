import pytest

from vllm_hybridspec.patches import ALL_PATCHES, PROCESSES, PatchError, VllmPatch, manifest_table
from vllm_hybridspec.versions import installed_vllm


class _Target:
    def greet(self, name):
        return f"hello {name}"

    @staticmethod
    def twice(x):
        return 2 * x


class _Child(_Target):
    pass


class _PatchGreet(VllmPatch):
    target = f"{__name__}:_Target.greet"
    what, why, vllm_versions, process = "shouts", "test", ">=0", "all"

    @staticmethod
    def replacement(original):
        def greet(self, name):
            return original(self, name).upper()

        return greet


class _PatchTwice(VllmPatch):
    target = f"{__name__}:_Target.twice"
    what, why, vllm_versions, process = "adds one", "test", ">=0", "all"

    @staticmethod
    def replacement(original):
        return lambda x: original(x) + 1


class _PatchInherited(VllmPatch):
    target = f"{__name__}:_Child.greet"
    what, why, vllm_versions, process = "child only", "test", ">=0", "all"

    @staticmethod
    def replacement(original):
        return lambda self, name: "child " + original(self, name)


def test_apply_keeps_original_and_reverts():
    original = _Target.greet
    _PatchGreet.apply()
    try:
        assert _Target().greet("a") == "HELLO A"
        assert _PatchGreet.original() is original
        assert _Target.greet.__name__ == "greet" and _Target.greet.__wrapped__ is original
    finally:
        _PatchGreet.revert()
    assert _Target.greet is original and _Target().greet("a") == "hello a"
    _PatchGreet.revert()  # reverting twice is harmless


def test_refuses_to_patch_twice():
    _PatchGreet.apply()
    try:
        with pytest.raises(PatchError, match="already applied"):
            _PatchGreet.apply()

        class _SecondPatchOfSameSymbol(_PatchGreet):
            pass

        with pytest.raises(PatchError, match="already patched by _PatchGreet"):
            _SecondPatchOfSameSymbol.apply()
    finally:
        _PatchGreet.revert()


def test_staticmethod_stays_static():
    _PatchTwice.apply()
    try:
        assert _Target.twice(3) == 7 and _Target().twice(3) == 7
    finally:
        _PatchTwice.revert()
    assert _Target.twice(3) == 6 and isinstance(_Target.__dict__["twice"], staticmethod)


def test_inherited_attribute_is_restored_by_deletion():
    _PatchInherited.apply()
    try:
        assert _Child().greet("b") == "child hello b" and _Target().greet("b") == "hello b"
    finally:
        _PatchInherited.revert()
    assert "greet" not in _Child.__dict__ and _Child().greet("b") == "hello b"


def test_missing_target_is_a_clear_error():
    class _Missing(VllmPatch):
        target = f"{__name__}:_Target.nope"
        what, why, vllm_versions, process = "x", "x", ">=0", "all"

    with pytest.raises(PatchError, match="does not exist"):
        _Missing.apply()


def test_incomplete_patch_class_is_rejected():
    with pytest.raises(TypeError, match="must set `why`"):
        class _NoWhy(VllmPatch):
            target, what, vllm_versions, process = "m:a", "x", ">=0", "all"

    with pytest.raises(TypeError, match="process"):
        class _BadProcess(VllmPatch):
            target, what, why, vllm_versions, process = "m:a", "x", "y", ">=0", "gpu"


@pytest.mark.parametrize("patch", ALL_PATCHES, ids=lambda p: p.__name__)
def test_every_patch_target_exists_in_installed_vllm(patch):
    from packaging.version import Version
    from packaging.specifiers import SpecifierSet

    assert Version(installed_vllm()[1]) in SpecifierSet(patch.vllm_versions)
    owner, attribute = patch.resolve()
    assert callable(getattr(owner, attribute))
    assert patch.process in PROCESSES


def test_manifest_lists_every_patch():
    table = manifest_table()
    for patch in ALL_PATCHES:
        assert patch.__name__ in table and patch.target in table
