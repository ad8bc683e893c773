"""The training runtime: data, dense model, parameter servers, master and workers."""
