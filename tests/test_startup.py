"""What a launcher's start costs: the modules a run without DP never imports."""

import subprocess
import sys

from tests.hang_guard import HANG_GUARD_S

HEAVY = ("dp_accounting", "scipy.stats", "mpmath")


def test_a_launcher_and_its_registry_import_no_accountant_until_dp_is_asked_for():
  """Every launcher imports every module of the package (the registry finds its parts there);
  dp-accounting, SciPy's statistics and mpmath (1-2 s together) wait for a run with DP."""
  code = ("import sys; import experiments.filfl; from fedjax_sel import registry; "
          "registry.package_modules(); "
          f"print([m for m in {HEAVY!r} if m in sys.modules])")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                       timeout=HANG_GUARD_S)
  assert out.stdout.strip() == "[]", out.stdout + out.stderr
