"""onebuild's version, in a module of its own: code that only needs the number imports nothing
else (a step's code digest follows imports).
"""

__version__ = "0.1.0"
