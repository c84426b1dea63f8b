// Package python runs the Python client's tests (clients/python/tests)
// against real `dlock serve` processes, the way a Python developer would
// use the client: Debian's python3 makes a venv, pip installs
// clients/python into it offline, and pytest runs with a freshly built
// dlock. It needs Debian's python3-venv, python3-pytest,
// python3-cryptography, python3-setuptools, python3-wheel and python3-pyflakes; without them
// the test is skipped, unless DLOCK_PYTHON_TESTS=require.
package python
