"""Analysis: what the session's data means, read with the predictor (predicted lines,
breakdowns, explanations); above :mod:`gpuwatch.session` and :mod:`gpuwatch.predict`."""
