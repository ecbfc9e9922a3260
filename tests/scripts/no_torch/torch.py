# Stands in for an absent PyTorch in tests/scripts: importing it fails as `import torch` fails without the package.
raise ImportError("No module named 'torch' (the stand-in of tests/scripts/no_torch)")
