"""Browser tests of the web dashboard: headless Chromium driven by Playwright."""
