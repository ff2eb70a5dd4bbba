"""MEND (Mitchell et al. 2022): editor networks (:mod:`.nets`), the editor (:mod:`.core`) and its training
(:mod:`.train`)."""

from editscope.edit.mend.core import (
                                      MendHParams,
                                      checkpoint_dir,
                                      compute,
                                      gradient_factors,
                                      load_checkpoint,
                                      load_editor,
                                      new_nets,
                                      save_checkpoint,
                                      saved_steps,
                                      snapshot_path,
                                      weight_updates,
)
from editscope.edit.mend.nets import LowRankMLP, MendNets, Normaliser
from editscope.edit.mend.train import prepare

__all__ = ["LowRankMLP", "MendHParams", "MendNets", "Normaliser", "checkpoint_dir", "compute", "gradient_factors",
           "load_checkpoint", "load_editor", "new_nets", "prepare", "save_checkpoint", "saved_steps", "snapshot_path",
           "weight_updates"]
