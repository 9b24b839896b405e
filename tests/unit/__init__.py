"""Pure tests (no processes, servers, Redis or models), one folder per part of the code."""
