"""The star benchmark: accelerator profiles, emulated targets, the sweep against the system model, plots."""
