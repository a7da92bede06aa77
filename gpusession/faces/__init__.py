"""The notebook and terminal faces: the %gpu magics, the gpusession CLI, live notices and transfers
with progress. server/, widgets/ and provisioner/ are faces too; they keep their own packages
because Jupyter finds them by those names. Every face takes its sentences from gpusession/words,
the layer below them all."""
