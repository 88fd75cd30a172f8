; Inno Setup script for SpecDeck (packaging\windows\build.ps1 passes /DAppVersion=x.y.z).
; Installs per user (no admin rights): the bundle, a Start menu entry, an optional desktop icon.
#ifndef AppVersion
  #define AppVersion "0.0.0"
#endif

[Setup]
AppId={{6D3A4C1E-2F7B-4B8E-9C55-53A1D7E0B6F2}
AppName=SpecDeck
AppVersion={#AppVersion}
AppPublisher=SpecDeck developers
DefaultDirName={localappdata}\Programs\SpecDeck
DefaultGroupName=SpecDeck
PrivilegesRequired=lowest
OutputDir=..\..\dist
OutputBaseFilename=SpecDeck-{#AppVersion}-setup
SetupIconFile=..\..\assets\icons\specdeck.ico
UninstallDisplayIcon={app}\specdeck.exe
Compression=lzma2
SolidCompression=yes
ArchitecturesAllowed=x64compatible
ArchitecturesInstallIn64BitMode=x64compatible

[Tasks]
Name: "desktopicon"; Description: "Create a desktop icon"; Flags: unchecked

[Files]
Source: "..\..\dist\SpecDeck\*"; DestDir: "{app}"; Flags: recursesubdirs ignoreversion

[Icons]
Name: "{group}\SpecDeck"; Filename: "{app}\specdeck.exe"
Name: "{autodesktop}\SpecDeck"; Filename: "{app}\specdeck.exe"; Tasks: desktopicon

[Run]
Filename: "{app}\specdeck.exe"; Description: "Start SpecDeck"; Flags: nowait postinstall skipifsilent
