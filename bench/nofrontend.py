"""What-if figure, not a product path: `rocm-audit dedup --check -q -p SITE` without the CLI
framework (importing typer and building its click commands), printing the same text report and
leaving the way `rocm-audit` does (the same collector settings, no interpreter teardown: see
cli.entry). Shows how much of a run is the front end. Usage: python nofrontend.py SITE"""

import gc
import os
import sys

from rocm_audit.dedup.run import run_dedup
from rocm_audit.output.text import render_text
from rocm_audit.rulebook.policy import load_policy, using_policy

gc.freeze()
gc.set_threshold(50_000, 20, 20)
with using_policy(load_policy([])):
    outcome = run_dedup([sys.argv[1]], mode="check")
    sys.stdout.write(render_text(outcome))
sys.stdout.flush()
os._exit(1 if outcome.sections["dedup"]["groups"] else 0)
