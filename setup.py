"""Which folders make the `ddptop` package: the one part of the build that is code.

The repository keeps the user's layout, one folder a part at the top
(core/, supervisor/, trainer/, tui/), and installs them as ddptop.core,
ddptop.supervisor, ddptop.trainer and ddptop.tui. Every package below a
part's folder is found by setuptools' own discovery, and every non-Python
file there (the dashboard's .tcss, py.typed) travels as package data, so a
new subpackage or stylesheet is in the wheel without a list to update.

Why setuptools and not hatchling's `sources`: hatchling refuses editable
installs when a rewrite adds a prefix (supervisor/ -> ddptop/supervisor/),
and `./dev` installs editable; setuptools' editable finder maps any
package-dir, so development and the wheel share this one mapping.
"""

from setuptools import find_namespace_packages, setup

ROOT = "ddptop"
PARTS = ("core", "supervisor", "trainer", "tui")
EXCLUDE = ("__pycache__", "*.__pycache__")

package_dir = {ROOT: ROOT} | {f"{ROOT}.{part}": part for part in PARTS}
packages = [ROOT, *(f"{ROOT}.{name}" for name in find_namespace_packages(ROOT, exclude=EXCLUDE))]
for part in PARTS:
    packages += [f"{ROOT}.{part}", *(f"{ROOT}.{part}.{name}" for name in find_namespace_packages(part, exclude=EXCLUDE))]

setup(
    packages=packages,
    package_dir=package_dir,
    package_data={package: ["*.tcss", "py.typed"] for package in packages},
    include_package_data=False,
)
