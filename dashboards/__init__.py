"""Review a study in the browser: the live Dash app and the static HTML report."""
