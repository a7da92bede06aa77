"""The notebook and terminal faces: the %gpu magics, the gpusession CLI, the one formatter of words
(words.py), live notices and transfers with progress. server/, widgets/ and provisioner/ are faces
too; they keep their own packages because Jupyter finds them by those names."""
