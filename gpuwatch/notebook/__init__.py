"""gpuwatch in a Jupyter notebook: ``%load_ext gpuwatch``.

Each cell becomes a phase with the automatic phases nested in it, and a line under each
cell that used torch memory says its peak and what the largest part of it was (see
``_extension``). Loaded by IPython through ``gpuwatch.load_ipython_extension``; imports
IPython only to display, and the predictor and explanations the dashboard uses.
"""

from ._extension import CellWatch, active, cell_name, load, unload
from ._plan import plan

__all__ = ["CellWatch", "active", "cell_name", "load", "plan", "unload"]
