"""Export ranked layouts as launch configs and ready-to-submit job scripts.

    axoplan export --model 320B --gpus 32768 --machine frontier --top 5 --out-dir plans/

Modules: ``job`` (nodes, wall time, site values), ``script`` (render one job script from the
machine YAML's ``launcher:`` block), ``saved`` (read a ranking saved by ``axoplan rank --out``),
``files`` (all-or-nothing writes), ``exporter`` (the top k, end to end). See docs/export.md.
"""

from __future__ import annotations

from axoplan.export.exporter import ExportedPlan, prepare_exports, summary, write_exports
from axoplan.export.job import JobSettings, SiteSettings
from axoplan.export.saved import SavedRanking, load_saved_ranking
from axoplan.export.script import payload_env, render_job_script

__all__ = ["ExportedPlan", "JobSettings", "SavedRanking", "SiteSettings", "load_saved_ranking", "payload_env",
           "prepare_exports", "render_job_script", "summary", "write_exports"]
