"""The analytical cost model, evaluated for all candidate layouts at once with numpy."""
