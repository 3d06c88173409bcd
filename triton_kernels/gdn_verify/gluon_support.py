"""What every Gluon form of gdn_verify needs from the toolchain before its own shape checks."""
import triton


def toolchain_refusal(form, gluon_parts, checked_versions, have_gluon, triton_version, capability):
    """Why `form` (e.g. "Gluon state pass") cannot run with this Triton / device (a sentence), or None: Gluon with
    gluon_parts importable, a Triton minor version it was compiled and read on (Gluon's API differs between them),
    and sm_90. triton_version None: the installed one; capability (major, minor), None off the GPU."""
    version = ".".join((triton_version or triton.__version__).split(".")[:2])
    if not have_gluon:
        return f"triton.experimental.gluon ({gluon_parts}) is not importable"
    if version not in checked_versions:
        return f"Triton {version} is not one the {form} was compiled on ({', '.join(checked_versions)})"
    if capability is None or tuple(capability) != (9, 0):
        return f"the {form} needs sm_90, got {capability}"
    return None
