"""Experiment and ablation files (``+experiment=``, ``+ablation=``), Hydra launchers."""
