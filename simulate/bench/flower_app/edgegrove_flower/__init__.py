"""Edgegrove's model under Flower: the ClientApp and ServerApp of `edgegrove bench flower`."""
