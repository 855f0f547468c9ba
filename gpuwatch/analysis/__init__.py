"""What gpuwatch concludes from the data: analyses that sit above the session and the predictor.

See docs/architecture.md for the floors of the house.
"""
