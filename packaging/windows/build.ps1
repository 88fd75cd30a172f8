# Build SpecDeck for Windows: dist\SpecDeck\ (PyInstaller onedir, windowed) and an installer
# (dist\SpecDeck-<version>-setup.exe, Inno Setup). Not run by CI (no Windows here).
#   powershell -ExecutionPolicy Bypass -File packaging\windows\build.ps1
# Needs Python 3.11+, Visual Studio Build Tools (llama-cpp-python compiles with MSVC), the
# Visual C++ redistributable (vcomp140.dll, llama.cpp's OpenMP), and Inno Setup 6 (iscc).
# For a GPU build set CMAKE_ARGS first, e.g. $env:CMAKE_ARGS = "-DGGML_VULKAN=on".
$ErrorActionPreference = "Stop"
Set-Location (Join-Path $PSScriptRoot "..\..")
if (-not (Test-Path .venv\Scripts\python.exe)) { py -3 -m venv .venv }
$python = ".venv\Scripts\python.exe"
# With llama.cpp's RPC backend (`specdeck worker`, Workers).
$env:CMAKE_ARGS = "-DGGML_RPC=ON $env:CMAKE_ARGS".Trim()
& $python -m pip install --quiet -e ".[dev]" "pyinstaller>=6.10"
& $python packaging\build_info.py | Out-Null
$version = (Get-Content packaging\build\VERSION).Trim()
Remove-Item -Recurse -Force dist\SpecDeck, build\pyinstaller -ErrorAction SilentlyContinue
& $python -m PyInstaller --noconfirm --clean --log-level WARN `
    --distpath dist --workpath build\pyinstaller packaging\specdeck.spec
if ($LASTEXITCODE -ne 0) { throw "PyInstaller failed" }
# The windowed app has no console: --self-test reports through its exit code.
$test = Start-Process -FilePath dist\SpecDeck\specdeck.exe -ArgumentList "--self-test" -Wait -PassThru
if ($test.ExitCode -ne 0) { throw "self-test failed with exit code $($test.ExitCode)" }
& iscc /DAppVersion=$version packaging\windows\specdeck.iss
if ($LASTEXITCODE -ne 0) { throw "Inno Setup failed" }
Write-Host "bundle: dist\SpecDeck and dist\SpecDeck-$version-setup.exe"
