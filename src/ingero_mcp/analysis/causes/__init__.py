"""Causes, read off the time accounting: what the feeding thread's lost time went to, and who took it.

Two readings of the accounting (accounting.py), per feeding process and its busiest feeding thread:
- contrast: in a slow phase (the work rate fell to half or less), the parts of the thread's time whose
  share grew against the healthy baseline are the symptom; the time lost (the phase's wall time
  times 1 - 1/slowdown) is shared among them by how much each grew; a recurrent phase (short slow
  episodes, accounting.py) is contrasted the same way over the seconds holding its episodes, and each
  part is explained in the episode where it grew most;
- steady: outside slow phases, time in which the GPU sat idle (1 - utilisation, per second) while
  the thread did something other than wait for it; without a GPU utilisation record this reading
  is labelled as such and kept LOW.
Each part then maps to a cause through one short table (`explain._PART_CAUSE`) and an explainer that names
the culprits from the rows: the tasks that held the CPU (per-CPU on-CPU aggregates, else the first
holders), the tasks that woke the thread (and what they themselves were doing), the other processes
using the GPU, the kind of CUDA calls whose time grew. Chains are ranked by the seconds they explain.

The rooms: context (a finding, the context; the parts and their labels are
models.PARTS and PART_LABEL), findings, culprits, sleeps, in_calls, explain (the table
from part to explainer), narration (chains).
"""

from ingero_mcp.analysis.causes.narration import accounting_chains, pace_threads

__all__ = ["accounting_chains", "pace_threads"]
